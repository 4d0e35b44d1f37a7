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

import difflib
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.envs import sim2real
from jaxrl.envs.brax_core import BraxCore
from jaxrl.envs.ids import OPTIONS, check_values, is_jax_env, parse_env_id
from jaxrl.envs.privileged import record_physics
from jaxrl.envs.state import EnvState
from jaxrl.envs.wrappers import NormalizeObservation, RecordEpisodeStatistics, RescaleAction
from jaxrl.errors import EnvError

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
            raise EnvError(f"num_envs must be >= 1, got {num_envs}.")
        self.core = core
        self.num_envs = int(num_envs)
        self.episode_length = int(episode_length or core.episode_length)
        if self.episode_length < 1:
            raise EnvError(f"episode_length must be >= 1, got {self.episode_length}.")
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


def _select(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per-env ``where(mask, a, b)`` over pytrees whose leaves have a leading env axis."""

    def sel(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(sel, a, b)


def _unknown(kind: str, name: str, known: tuple[str, ...] | list[str]) -> EnvError:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(f'{kind}:{c}' for c in close)}?" if close else ""
    return EnvError(f"Unknown {kind} environment {name!r}.{hint} Known: {', '.join(known)}.")


def make_core(env_id: str) -> tuple[Any, dict[str, Any]]:
    """The core named by ``env_id`` and the loop-level options (``episode_length``).

    Raises:
        EnvError: an unknown env or option, or an option value of the wrong type.
    """
    kind, name, options = parse_env_id(env_id)
    loop_keys = ("episode_length", *OPTIONS)
    loop_options = {k: options.pop(k) for k in loop_keys if k in options}
    check_values(loop_options, env_id)
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
        except ValueError as err:  # a value the env refuses, e.g. jax:pendulum?m=-1
            raise EnvError(f"Environment {env_id!r}: {err}") from None
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

    Raises:
        EnvError: an unknown env or option, or an unusable option value (``num_envs`` < 1
            included); the message names the id and the option.
    """
    core, options = make_core(env_id)
    wrappers, options = sim2real.split_options(options)
    env: Any = VecEnv(core, num_envs, options.get("episode_length"), name=env_id)
    env = sim2real.wrap_actuation(env, wrappers, env_id)
    env = RecordEpisodeStatistics(RescaleAction(env, core.action_low, core.action_high))
    env = record_physics(env, core)  # randomized physics: logged per episode
    env = sim2real.wrap_agent_side(env, wrappers, core, env_id)
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
