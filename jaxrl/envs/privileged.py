"""Privileged observations for the critic (asymmetric actor-critic, as in sim-to-real training).

On a robot the policy sees noisy, delayed sensor readings; in simulation the critic, which is
not deployed, may see the true state and the drawn physics. Two wrappers on the JAX env protocol
build that layout:

- ``RecordPrivileged`` sits under the sensor-model wrappers (noise, delays, history) and keeps
  what they would hide in ``info``: the clean observation and, for randomized Brax envs, the
  episode's drawn physics (``randomization.summary``).
- ``AppendPrivileged`` sits on top of them and appends those features to the observation:
  ``obs = [what the policy sees (actor_observation_size), privileged features]``, for ``obs``
  and ``final_obs`` alike.

The agent's config then says how many leading features its actor sees (the registry's
``actor_obs_field``; ``jaxrl train`` sets it from the env), so the critic (or PPO's value
function) reads the whole vector and the actor only its first part. Exports take only the
actor's part. ``make_jax_env`` adds both wrappers for the env-id option ``privileged=true``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.envs.brax_core import BraxCore
from jaxrl.envs.randomization import summary
from jaxrl.envs.state import EnvState
from jaxrl.envs.wrappers import Wrapper


def _physics(core: Any, sim: Any) -> jax.Array:
    """``[num_envs, p]`` drawn physics of the episodes in ``sim`` (``p = 0`` without any)."""
    if isinstance(core, BraxCore) and core.ranges is not None:
        values = summary(sim[0])
        return jnp.stack([values[k] for k in sorted(values)], axis=-1).astype(jnp.float32)
    return jnp.zeros((jax.tree.leaves(sim)[0].shape[0], 0), jnp.float32)


class RecordPrivileged(Wrapper):
    """Keep the clean observation and the drawn physics in ``info`` before sensors distort them.

    ``info["privileged"]`` goes with ``obs`` (the episode now running) and
    ``info["privileged_final"]`` with ``info["final_obs"]`` (the episode the transition belongs
    to, whose physics the auto-reset may just have replaced).

    Args:
        env: the env to wrap (below the noise, delay and history wrappers).
        core: the env's core, whose simulator state holds the drawn physics (``BraxCore``
            with ``randomize``); other cores contribute the clean observation only.
    """

    def __init__(self, env: Any, core: Any):
        super().__init__(env)
        self.core = core
        shape = jax.eval_shape(lambda k: _physics(core, env.reset(k).sim), jax.random.key(0))
        self.physics_size = int(shape.shape[-1])
        self.privileged_size = int(env.observation_size) + self.physics_size

    def reset(self, key: jax.Array) -> EnvState:
        """Reset; the privileged features of the first observations."""
        state = self.env.reset(key)
        features = jnp.concatenate([state.obs, _physics(self.core, state.sim)], axis=-1)
        info = {**state.info, "privileged": features, "privileged_final": features}
        return state.replace(info=info)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step; record the features of ``obs`` and of ``final_obs``."""
        before = _physics(self.core, state.sim)
        state = self.env.step(state, action)
        info = {
            **state.info,
            "privileged": jnp.concatenate([state.obs, _physics(self.core, state.sim)], -1),
            "privileged_final": jnp.concatenate([state.info["final_obs"], before], -1),
        }
        return state.replace(info=info)


class AppendPrivileged(Wrapper):
    """Append ``RecordPrivileged``'s features to ``obs`` and ``final_obs``.

    ``actor_observation_size`` is the width of what the policy sees (the wrapped env's
    observation); ``observation_size`` grows by the privileged features.

    Args:
        env: the env to wrap (above the sensor wrappers, with a ``RecordPrivileged`` below).
    """

    def __init__(self, env: Any):
        super().__init__(env)
        self.actor_observation_size = int(env.observation_size)
        self.observation_size = self.actor_observation_size + int(env.privileged_size)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset and append."""
        return self._append(self.env.reset(key))

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step and append (the wrapped env gets its own, actor-sized observation back)."""
        inner = state.replace(obs=state.obs[:, : self.actor_observation_size])
        return self._append(self.env.step(inner, action))

    def _append(self, state: EnvState) -> EnvState:
        info = state.info
        final = jnp.concatenate([info["final_obs"], info["privileged_final"]], -1)
        obs = jnp.concatenate([state.obs, info["privileged"]], -1)
        return state.replace(obs=obs, info={**info, "final_obs": final})


class RecordPhysics(Wrapper):
    """Report each ended episode's drawn physics in ``info["episode_values"]`` (for logging).

    ``physics/<name>`` per env (``randomization.summary``: mean friction, torso mass and CoM),
    nonzero where an episode ended on the step; the fused loop logs their means over the
    episodes of each log interval. ``record_physics`` adds it to randomized Brax envs.

    Args:
        env: the env to wrap.
        core: its core (a ``BraxCore`` with ``randomize``).
    """

    def __init__(self, env: Any, core: Any):
        super().__init__(env)
        self.core = core

    def _values(self, sim: Any, ended: jax.Array) -> dict[str, jax.Array]:
        return {f"physics/{k}": v * ended for k, v in summary(sim[0]).items()}

    def reset(self, key: jax.Array) -> EnvState:
        """Reset; no episode has ended yet."""
        state = self.env.reset(key)
        values = self._values(state.sim, jnp.zeros(self.num_envs, jnp.float32))
        return state.replace(info={**state.info, "episode_values": values})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step; the physics of the episodes that just ended (drawn before the auto-reset)."""
        sim = state.sim
        state = self.env.step(state, action)
        ended = ((state.terminated + state.truncation) > 0).astype(jnp.float32)
        return state.replace(info={**state.info, "episode_values": self._values(sim, ended)})


def record_physics(env: Any, core: Any) -> Any:
    """``RecordPhysics(env, core)`` when ``core`` draws its physics per episode, else ``env``."""
    if isinstance(core, BraxCore) and core.ranges is not None:
        return RecordPhysics(env, core)
    return env


def wrap_privileged(env: Any, core: Any, sensors: Any) -> Any:
    """``AppendPrivileged(sensors(RecordPrivileged(env, core)))``.

    Args:
        env: the env below the sensor model.
        core: its core.
        sensors: ``env -> env`` adding the wrappers that distort what the policy sees.
    """
    return AppendPrivileged(sensors(RecordPrivileged(env, core)))


__all__ = [
    "AppendPrivileged",
    "RecordPhysics",
    "RecordPrivileged",
    "record_physics",
    "wrap_privileged",
]
