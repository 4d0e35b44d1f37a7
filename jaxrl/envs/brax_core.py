"""Brax / MuJoCo-MJX environments as JAX env cores (``brax:NAME`` ids).

``BraxCore`` adapts a ``brax.envs`` environment to the core protocol of ``jaxrl.envs.jax_envs``
(``reset(key) -> (sim, obs)``, ``step(sim, action) -> (sim, obs, reward, terminated)``), with
optional domain randomization drawn at every reset (``jaxrl.envs.randomization``). It lives apart
from ``jax_envs`` so that the wrappers that look into a Brax simulator (``privileged``) can
recognise it without importing the module that builds envs from ids.
"""

from __future__ import annotations

import copy
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.randomization import Ranges, check_backend, randomize
from jaxrl.errors import EnvError


def _strong(tree: Any) -> Any:
    """``tree`` without weak types.

    Brax computes some fields from Python scalars; a state whose types change after a step
    would recompile the next program it enters.
    """
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), tree)


class BraxCore:
    """A ``brax.envs`` environment as a core (Brax's own wrappers are not used).

    With ``randomize`` (``jaxrl.envs.randomization.Ranges``, or True for the default ranges)
    the simulator state is ``(model, brax_state)``: every reset draws a new model, so each
    episode runs on its own physics inside the same compiled program. In an env id the ranges
    are options: ``brax:NAME?randomize=true`` for the defaults, and any ``Ranges`` field as
    ``FIELD=LOW:HIGH`` / ``FIELD=K`` / ``FIELD=none`` to override it (which also turns
    randomization on), e.g. ``brax:inverted_pendulum?mass_scale=0.5:2&friction=none``.

    Args:
        name: a Brax env name, e.g. ``"ant"``.
        backend: ``"mjx"`` (default), ``"generalized"``, ``"positional"`` or ``"spring"``.
        randomize: domain randomization ranges (every backend maps them, see
            ``randomization.BACKEND_UNSUPPORTED``), True for the defaults,
            None or False for none.
        **kwargs: passed to ``brax.envs.get_environment`` (e.g. ``terminate_when_unhealthy``).

    Raises:
        EnvError: ``randomize`` is not a ``Ranges``/bool/None, or it sets a parameter the
            backend does not simulate.
    """

    episode_length = 1000
    action_low = -1.0
    action_high = 1.0

    def __init__(self, name: str, backend: str = "mjx", randomize: Any = None, **kwargs: Any):
        from brax import envs

        self.name = f"brax:{name}"
        self.env = envs.get_environment(name, backend=backend, **kwargs)
        # Brax's Ant, Hopper, Humanoid and Walker2d terminate when unhealthy (an option); the
        # inverted pendulums when the pole falls; the others never.
        fall = name.startswith("inverted_")
        self.can_terminate = bool(getattr(self.env, "_terminate_when_unhealthy", fall))
        # Brax's own ``observation_size`` runs a reset op by op (17 s for MJX's inverted
        # pendulum on a 2-core CPU); its shape alone needs only a trace (0.6 s).
        obs = jax.eval_shape(self.env.reset, jax.random.key(0)).obs
        self.observation_size = obs.shape[-1]
        self.action_size = self.env.action_size
        if not (randomize is None or isinstance(randomize, bool | Ranges)):
            raise EnvError(
                f"BraxCore(randomize=...) takes a jaxrl.envs.randomization.Ranges, True (the "
                f"default ranges) or None, not {randomize!r}."
            )
        self.ranges = Ranges() if randomize is True else (randomize or None)
        if self.ranges is not None:
            try:
                check_backend(self.ranges, backend, name)
            except ValueError as err:
                raise EnvError(str(err)) from None

    def _with(self, model: Any) -> Any:
        """The Brax env stepping ``model``: a shallow copy, so no traced model outlives a trace."""
        env = copy.copy(self.env)
        env.sys = model
        return env

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        """Brax reset; the simulator state is Brax's ``State`` (and the drawn model)."""
        if self.ranges is None:
            state = _strong(self.env.reset(key))
            return state, state.obs
        k_model, k_state = jax.random.split(key)
        model = randomize(self.env.sys, k_model, self.ranges)
        state = _strong(self._with(model).reset(k_state))
        return (model, state), state.obs

    def kick(self, state: Any, dv: jax.Array) -> Any:
        """``state`` (one env's) with ``dv`` (``[2]``, m/s) added to the root's velocity.

        A free-floating root (Ant, humanoids) gets ``dv`` on its x and y velocity; otherwise
        the first joint (a cart, a hip) gets ``dv[0]``. Used by ``sim2real.Pushes``.
        """
        model, inner = state if self.ranges is not None else (None, state)
        pipeline = inner.pipeline_state
        qvel = pipeline.qvel
        if self._free_root:
            qvel = qvel.at[:2].add(dv)
        else:
            qvel = qvel.at[0].add(dv[0])
        inner = inner.replace(pipeline_state=pipeline.replace(qvel=qvel))
        return inner if model is None else (model, inner)

    @property
    def _free_root(self) -> bool:
        types = np.asarray(self.env.sys.jnt_type)
        return bool(types.size) and int(types[0]) == 0  # mjJNT_FREE

    def step(self, state: Any, action: jax.Array) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
        """Brax step; ``done`` is Brax's termination flag."""
        if self.ranges is None:
            state = _strong(self.env.step(state, action))
            return state, state.obs, state.reward, state.done
        model, inner = state
        inner = _strong(self._with(model).step(inner, action))
        return (model, inner), inner.obs, inner.reward, inner.done


__all__ = ["BraxCore"]
