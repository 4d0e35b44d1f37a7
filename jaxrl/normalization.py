"""Running mean and variance of a stream of vectors, as a pytree (optax-style functions).

A core piece: observation normalization in the JAX env wrappers and the PETS model's input/output
scaling both use it. Imports only JAX.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct


class RunningStats(struct.PyTreeNode):
    """Running mean and variance of a stream of vectors (Chan et al. parallel update).

    Attributes:
        count: number of vectors seen (float32, starts at a tiny epsilon).
        mean: ``[size]`` running mean.
        var: ``[size]`` running (population) variance.
    """

    count: jax.Array
    mean: jax.Array
    var: jax.Array


def running_stats_init(size: int) -> RunningStats:
    """Statistics before any data: mean 0, variance 1."""
    return RunningStats(
        count=jnp.float32(1e-4), mean=jnp.zeros(size, jnp.float32), var=jnp.ones(size, jnp.float32)
    )


def running_stats_update(stats: RunningStats, batch: jax.Array) -> RunningStats:
    """Merge a ``[n, size]`` batch into the statistics (Chan, Golub & LeVeque, 1979)."""
    chex.assert_rank(batch, 2)
    n = jnp.float32(batch.shape[0])
    b_mean = batch.mean(axis=0)
    b_var = batch.var(axis=0)
    total = stats.count + n
    delta = b_mean - stats.mean
    mean = stats.mean + delta * n / total
    m2 = stats.var * stats.count + b_var * n + delta**2 * stats.count * n / total
    return RunningStats(count=total, mean=mean, var=m2 / total)


def normalize(
    stats: RunningStats, x: jax.Array, clip: float = 10.0, eps: float = 1e-8
) -> jax.Array:
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)``."""
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + eps), -clip, clip)


__all__ = ["RunningStats", "normalize", "running_stats_init", "running_stats_update"]
