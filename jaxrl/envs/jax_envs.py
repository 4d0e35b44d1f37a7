"""JAX environments: one protocol for Brax / MJX envs and small pure-JAX envs.

A *core* is a single, unbatched environment with ``reset(key) -> (sim, obs)`` and
``step(sim, action) -> (sim, obs, reward, terminated)`` in its native action range, with no time
limit and no auto-reset (see ``jaxrl.envs.classic`` and ``BraxCore``). ``VecEnv`` turns a core into
the env the training loop uses:

```python
env = make_jax_env("brax:ant?backend=positional", num_envs=64)
state = env.reset(key)                 # EnvState with [num_envs, ...] leaves
state = env.step(state, actions)       # actions in [-1, 1], shape [num_envs, action_size]
state.obs                # next observation (a reset observation where an episode ended)
state.info["final_obs"]  # the true next observation of this transition (bootstrap from it)
state.terminated         # 1.0 where this transition terminated
state.truncation         # 1.0 where the time limit cut the episode
```

Envs are plain Python objects closed over by ``jit``; every changing quantity is in ``EnvState``,
so the state can be scanned, vmapped over seeds and checkpointed.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.gym import EnvError
from jaxrl.envs.state import EnvState
from jaxrl.envs.wrappers import NormalizeObservation, RecordEpisodeStatistics, RescaleAction

BRAX_ENVS = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_pendulum",
    "inverted_double_pendulum",
    "pusher",
    "reacher",
    "walker2d",
)
BRAX_BACKENDS = ("mjx", "generalized", "positional", "spring")


class VecEnv:
    """``num_envs`` copies of a core with a time limit and auto-reset that keeps the final obs.

    Resets are computed only when some copy finished (``lax.cond`` on a scalar), so long episodes
    do not pay for a reset every step. Actions are passed to the core unchanged (see
    ``RescaleAction``).
    """

    actor_observation_size: int | None = None
    """Leading observation features the policy may see; None: all (no privileged features)."""

    def __init__(self, core: Any, num_envs: int, episode_length: int | None = None, name: str = ""):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        self.core = core
        self.num_envs = int(num_envs)
        self.episode_length = int(episode_length or core.episode_length)
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}.")
        self.name = name or getattr(core, "name", type(core).__name__)
        self.observation_size = int(core.observation_size)
        self.action_size = int(core.action_size)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset every copy; ``key`` is split into one key per copy."""
        keys = jax.random.split(key, (self.num_envs, 2))
        sim, obs = jax.vmap(self.core.reset)(keys[:, 0])
        zeros = jnp.zeros(self.num_envs, jnp.float32)
        return EnvState(
            sim=sim,
            obs=obs,
            reward=zeros,
            terminated=zeros,
            truncation=zeros,
            time=jnp.zeros(self.num_envs, jnp.int32),
            key=keys[:, 1],
            info={"final_obs": obs},
            extras={},
        )

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step every copy with ``action`` (native range), auto-resetting finished episodes."""
        sim, obs, reward, terminated = jax.vmap(self.core.step)(state.sim, action)
        time = state.time + 1
        terminated = terminated.astype(jnp.float32)
        truncation = jnp.where((time >= self.episode_length) & (terminated == 0), 1.0, 0.0)
        ended = (terminated + truncation) > 0
        split = jax.vmap(jax.random.split)(state.key)
        key, reset_keys = split[:, 0], split[:, 1]

        def reset_ended(_: Any) -> tuple[Any, jax.Array]:
            new_sim, new_obs = jax.vmap(self.core.reset)(reset_keys)
            return _select(ended, new_sim, sim), _select(ended, new_obs, obs)

        sim_next, obs_next = jax.lax.cond(ended.any(), reset_ended, lambda _: (sim, obs), None)
        return state.replace(
            sim=sim_next,
            obs=obs_next,
            reward=reward.astype(jnp.float32),
            terminated=terminated,
            truncation=truncation.astype(jnp.float32),
            time=jnp.where(ended, 0, time),
            key=key,
            info={**state.info, "final_obs": obs},
        )

    def close(self) -> None:
        """Nothing to release; JAX envs have ``close`` so that callers treat both kinds alike."""


def _strong(tree: Any) -> Any:
    """``tree`` without weak types.

    Brax computes some fields from Python scalars; a state whose types change after a step
    would recompile the next program it enters.
    """
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), tree)


def _select(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per-env ``where(mask, a, b)`` over pytrees whose leaves have a leading env axis."""

    def sel(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(sel, a, b)


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

        from jaxrl.envs.randomization import Ranges

        self.name = f"brax:{name}"
        self.env = envs.get_environment(name, backend=backend, **kwargs)
        self.observation_size = self.env.observation_size
        self.action_size = self.env.action_size
        if not (randomize is None or isinstance(randomize, bool | Ranges)):
            raise EnvError(
                f"BraxCore(randomize=...) takes a jaxrl.envs.randomization.Ranges, True (the "
                f"default ranges) or None, not {randomize!r}."
            )
        self.ranges = Ranges() if randomize is True else (randomize or None)
        if self.ranges is not None:
            from jaxrl.envs.randomization import check_backend

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
        from jaxrl.envs.randomization import randomize

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


def parse_env_id(env_id: str) -> tuple[str, str, dict[str, Any]]:
    """Split ``'brax:ant?backend=positional&episode_length=500'`` into (kind, name, options).

    Option values are converted to int, float or bool where they look like one.
    """
    kind, _, rest = env_id.partition(":")
    name, _, query = rest.partition("?")
    options: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise EnvError(f"Environment {env_id!r}: option {part!r} is not of the form key=value.")
        options[key] = _parse_value(value)
    return kind, name, options


def _parse_value(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def is_jax_env(env_id: str) -> bool:
    """True for ids the fused loop runs (``brax:...`` and ``jax:...``)."""
    return env_id.split(":", 1)[0] in ("brax", "jax") and ":" in env_id


def _unknown(kind: str, name: str, known: tuple[str, ...] | list[str]) -> EnvError:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(f'{kind}:{c}' for c in close)}?" if close else ""
    return EnvError(f"Unknown {kind} environment {name!r}.{hint} Known: {', '.join(known)}.")


def make_core(env_id: str) -> tuple[Any, dict[str, Any]]:
    """The core named by ``env_id`` and the loop-level options (``episode_length``)."""
    kind, name, options = parse_env_id(env_id)
    from jaxrl.envs.sim2real import OPTIONS

    loop_keys = ("episode_length", *OPTIONS)
    loop_options = {k: options.pop(k) for k in loop_keys if k in options}
    if kind == "brax":
        if name not in BRAX_ENVS:
            raise _unknown("brax", name, BRAX_ENVS)
        from jaxrl.envs.randomization import close_field, field_names, ranges_from_options

        backend = options.pop("backend", "mjx")
        if backend not in BRAX_BACKENDS:
            raise EnvError(
                f"Environment {env_id!r}: unknown Brax backend {backend!r}; use one of "
                f"{', '.join(BRAX_BACKENDS)} (e.g. brax:{name}?backend=positional)."
            )
        ranges = ranges_from_options(options, env_id)
        try:
            core = BraxCore(name, backend, randomize=ranges, **options)
        except TypeError as err:
            hints = [f"{close_field(k)} (not {k})" for k in options if close_field(k)]
            hint = f" Did you mean {', '.join(hints)}?" if hints else ""
            raise EnvError(
                f"Environment {env_id!r}: bad option ({err}).{hint} Randomization options: "
                f"randomize, {', '.join(field_names())}."
            ) from None
        return core, loop_options
    if kind == "jax":
        from jaxrl.envs.classic import CLASSIC_ENVS

        if name not in CLASSIC_ENVS:
            raise _unknown("jax", name, sorted(CLASSIC_ENVS))
        try:
            return CLASSIC_ENVS[name](**options), loop_options
        except TypeError as err:
            import inspect

            own = list(inspect.signature(CLASSIC_ENVS[name]).parameters)
            raise EnvError(
                f"Environment {env_id!r}: bad option ({err}). jax:{name} takes "
                f"{', '.join(own + list(loop_keys)) or 'no options'}."
            ) from None
    raise EnvError(
        f"Environment {env_id!r} is not a JAX env id; use 'brax:NAME' (one of "
        f"{', '.join(BRAX_ENVS)}) or 'jax:NAME'."
    )


def make_jax_env(env_id: str, num_envs: int, normalize_obs: bool = False) -> Any:
    """Build the vectorized env the fused loop uses, with standard wrappers.

    Args:
        env_id: ``brax:NAME[?backend=mjx&episode_length=1000&...]`` or ``jax:NAME[?...]``,
            e.g. ``jax:pendulum?obs_noise=0.05&action_delay=1:3``.
        num_envs: parallel copies.
        normalize_obs: add a running observation normalizer (``NormalizeObservation``).

    Returns:
        ``RecordEpisodeStatistics(RescaleAction(VecEnv(core)))``, with the sim-to-real
        wrappers the id's options ask for (``jaxrl.envs.sim2real.OPTIONS``: ``decimation``,
        ``action_filter``, ``action_delay``, ``obs_delay``, ``obs_noise``, ``obs_history``),
        optionally inside ``NormalizeObservation``; its actions are in ``[-1, 1]``.
    """
    from jaxrl.envs import sim2real
    from jaxrl.envs.privileged import record_physics

    core, options = make_core(env_id)
    wrappers, options = sim2real.split_options(options)
    env: Any = VecEnv(core, num_envs, options.get("episode_length"), name=env_id)
    env = sim2real.wrap_actuation(env, wrappers)
    env = RecordEpisodeStatistics(RescaleAction(env, core.action_low, core.action_high))
    env = record_physics(env, core)  # randomized physics: logged per episode
    env = sim2real.wrap_agent_side(env, wrappers, core)
    if normalize_obs:
        env = NormalizeObservation(env)
    return env


__all__ = [
    "BRAX_BACKENDS",
    "BRAX_ENVS",
    "BraxCore",
    "EnvState",
    "VecEnv",
    "is_jax_env",
    "make_core",
    "make_jax_env",
    "parse_env_id",
]
