"""RL math as small pure functions (in the spirit of rlax)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl.types import Params


def td_target(
    reward: jax.Array, terminal: jax.Array, next_value: jax.Array, discount: float | jax.Array
) -> jax.Array:
    """One-step TD target ``r + gamma * (1 - terminal) * V(s')``.

    Truncated episodes have ``terminal = 0`` and are bootstrapped; only true terminations cut the
    return (Pardo et al., 2018, "Time Limits in Reinforcement Learning").

    Args:
        reward: ``[B]`` rewards.
        terminal: ``[B]`` 1.0 where the episode terminated.
        next_value: ``[B]`` value estimate of the next state.
        discount: scalar discount factor gamma.

    Returns:
        ``[B]`` targets (not stop-gradiented; callers decide).
    """
    chex.assert_rank([reward, terminal, next_value], 1)
    chex.assert_equal_shape([reward, terminal, next_value])
    return reward + discount * (1.0 - terminal) * next_value


def polyak_update(params: Params, target_params: Params, tau: float | jax.Array) -> Params:
    """Soft target update ``target <- tau * params + (1 - tau) * target``."""
    return jax.tree.map(lambda p, t: tau * p + (1.0 - tau) * t, params, target_params)


def min_over_ensemble(qs: jax.Array) -> jax.Array:
    """Clipped double-Q: minimum over the leading ensemble axis of ``[num_qs, B]`` values."""
    chex.assert_rank(qs, 2)
    return jnp.min(qs, axis=0)


def subsample_ensemble(key: jax.Array, qs: jax.Array, num_min: int | None) -> jax.Array:
    """Minimum over a random subset of ``num_min`` ensemble members (REDQ / RLPD targets).

    ``num_min=None`` (or the full size) takes the minimum over all members.
    """
    chex.assert_rank(qs, 2)
    if num_min is None or num_min >= qs.shape[0]:
        return jnp.min(qs, axis=0)
    idx = jax.random.choice(key, qs.shape[0], (num_min,), replace=False)
    return jnp.min(qs[idx], axis=0)
