"""Wrappers for JAX envs: pure transforms whose state lives in ``EnvState.extras``.

Each wrapper has the env interface (``reset(key)``, ``step(state, action)``, ``num_envs``,
``observation_size``, ``action_size``, ``episode_length``) and forwards other attributes to the
env it wraps, so wrappers stack: ``NormalizeObservation(RecordEpisodeStatistics(env))``.

The running statistics come from the core module :mod:`jaxrl.normalization` (re-exported here).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.state import EnvState
from jaxrl.normalization import RunningStats, normalize, running_stats_init, running_stats_update


class Wrapper:
    """Base class: forwards everything to the wrapped env."""

    def __init__(self, env: Any):
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset the wrapped env."""
        return self.env.reset(key)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step the wrapped env."""
        return self.env.step(state, action)


class RescaleAction(Wrapper):
    """Map agent actions in ``[-1, 1]`` (clipped) to the env's ``[low, high]``."""

    def __init__(self, env: Any, low: Any, high: Any):
        super().__init__(env)
        self.low = np.broadcast_to(np.asarray(low, np.float32), (env.action_size,)).copy()
        self.high = np.broadcast_to(np.asarray(high, np.float32), (env.action_size,)).copy()
        if not np.all(self.high > self.low):
            raise ValueError(f"Action bounds need high > low, got low={low}, high={high}.")

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Rescale, then step."""
        action = jnp.clip(action, -1.0, 1.0)
        native = self.low + (action + 1.0) * 0.5 * (self.high - self.low)
        return self.env.step(state, native)


class RecordEpisodeStatistics(Wrapper):
    """Put ``episode_return`` / ``episode_length`` of episodes that just ended into ``info``.

    Both are zero for envs whose episode continues; use ``state.terminated + state.truncation``
    as the mask.
    """

    def reset(self, key: jax.Array) -> EnvState:
        """Reset and zero the running sums."""
        state = self.env.reset(key)
        zeros = jnp.zeros(self.num_envs, jnp.float32)
        extras = {**state.extras, "episode": {"return": zeros, "length": zeros}}
        info = {**state.info, "episode_return": zeros, "episode_length": zeros}
        return state.replace(extras=extras, info=info)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step and update the running return / length."""
        state = self.env.step(state, action)
        running = state.extras["episode"]
        ret, length = running["return"] + state.reward, running["length"] + 1.0
        ended = (state.terminated + state.truncation) > 0
        extras = {
            **state.extras,
            "episode": {
                "return": jnp.where(ended, 0.0, ret),
                "length": jnp.where(ended, 0.0, length),
            },
        }
        info = {
            **state.info,
            "episode_return": jnp.where(ended, ret, 0.0),
            "episode_length": jnp.where(ended, length, 0.0),
        }
        return state.replace(extras=extras, info=info)


class NormalizeObservation(Wrapper):
    """Normalize observations with running statistics updated inside ``step`` (under jit).

    The statistics live in ``state.extras["obs_stats"]`` (so they are checkpointed with the env
    state). They are updated with every new raw observation the agent will see, unless
    ``update=False`` (evaluation: copy the training statistics in with ``with_stats``). Both
    ``obs`` and ``info["final_obs"]`` are normalized with the statistics after the update.
    """

    def __init__(self, env: Any, update: bool = True, clip: float = 10.0):
        super().__init__(env)
        self.update = update
        self.clip = clip

    def reset(self, key: jax.Array) -> EnvState:
        """Reset; fresh statistics include the reset observations when updating."""
        state = self.env.reset(key)
        stats = running_stats_init(self.observation_size)
        if self.update:
            stats = running_stats_update(stats, state.obs)
        return self._normalized(state, stats)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step the raw env, update the statistics, return normalized observations."""
        stats = state.extras["obs_stats"]
        raw = state.replace(obs=state.extras["raw_obs"])
        state = self.env.step(raw, action)
        if self.update:
            stats = running_stats_update(stats, state.obs)
        return self._normalized(state, stats)

    def _normalized(self, state: EnvState, stats: RunningStats) -> EnvState:
        extras = {**state.extras, "obs_stats": stats, "raw_obs": state.obs}
        info = {**state.info, "final_obs": normalize(stats, state.info["final_obs"], self.clip)}
        return state.replace(obs=normalize(stats, state.obs, self.clip), info=info, extras=extras)

    def with_stats(self, state: EnvState, stats: RunningStats) -> EnvState:
        """``state`` with the given statistics (e.g. the training env's, for evaluation)."""
        extras = {**state.extras, "obs_stats": stats}
        return state.replace(
            obs=normalize(stats, state.extras["raw_obs"], self.clip), extras=extras
        )


__all__ = [
    "NormalizeObservation",
    "RecordEpisodeStatistics",
    "RescaleAction",
    "RunningStats",
    "Wrapper",
    "normalize",
    "running_stats_init",
    "running_stats_update",
]
