"""The state of a batch of JAX envs: what ``VecEnv`` and every wrapper read and return.

It lives apart from ``jax_envs`` (the envs) and ``wrappers`` so that both import it and neither
imports the other's module for it; so do two per-env helpers the wrappers share
(``episode_ended``, ``where_per_env``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


class EnvState(struct.PyTreeNode):
    """State of a batch of JAX envs after a step (every leaf has a leading ``num_envs`` axis).

    Attributes:
        sim: the cores' simulator state.
        obs: observation to act on next (a fresh reset observation where an episode just ended).
        reward: reward of the last transition.
        terminated: 1.0 where the last transition terminated (no bootstrapping; a time limit
            is ``truncation``, never this).
        truncation: 1.0 where the episode was cut by the time limit (bootstrap from final_obs).
        time: steps taken in the current episode.
        key: per-env RNG keys for resets.
        info: ``final_obs`` (true next observation of the last transition) and, from
            ``RecordEpisodeStatistics``, ``episode_return`` / ``episode_length`` of episodes that
            ended on the last step (zero elsewhere).
        extras: wrapper states (e.g. the observation normalizer), keyed by wrapper.
    """

    sim: Any
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncation: jax.Array
    time: jax.Array
    key: jax.Array
    info: dict[str, jax.Array]
    extras: dict[str, Any]


__all__ = ["EnvState"]


def episode_ended(state: EnvState) -> jax.Array:
    """``[num_envs]`` bool: the episode ended on the last step (the env auto-reset)."""
    return (state.terminated + state.truncation) > 0


def where_per_env(mask: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """Per-env ``where`` for arrays with a leading env axis."""
    return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)
