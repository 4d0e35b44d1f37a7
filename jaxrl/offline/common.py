"""Pieces every offline agent shares: fixed dataset statistics applied inside the agent.

An offline agent holds a ``DataNorm`` (field ``norm``). It starts as the identity; the offline loop
replaces it with statistics of the dataset when the agent's config asks for observation or reward
normalization. Because the agent applies it itself (to batches in ``update`` and to observations
in ``sample_actions`` / ``eval_actions``), raw observations and rewards flow everywhere else: the
buffer, online fine-tuning, evaluation and exported policies need no extra wrapper.

PRDC also keeps the dataset's (observation, action) rows on the device (``DatasetRows``, field
``rows``), set by the offline loop like ``norm``, to search the nearest row inside its update.

Also here: the config checks the diffusion and flow agents share, and candidate selection (IDQL
and Diffusion-QL sample several actions per observation and keep one by its value).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.config import REWARD_NORMALIZATIONS, ConfigError, check_choice, check_range
from jaxrl.generative import map_rows as map_rows
from jaxrl.generative import observation_key as observation_key
from jaxrl.types import Transition


class DataNorm(struct.PyTreeNode):
    """``obs -> (obs - obs_mean) / obs_std`` and ``reward -> reward * reward_scale + reward_shift``.

    Attributes:
        obs_mean: ``[obs_dim]`` mean subtracted from observations.
        obs_std: ``[obs_dim]`` standard deviation observations are divided by (kept > 0).
        reward_scale: scalar multiplying rewards.
        reward_shift: scalar added to rewards after scaling.
    """

    obs_mean: jax.Array
    obs_std: jax.Array
    reward_scale: jax.Array
    reward_shift: jax.Array

    @classmethod
    def identity(cls, obs_dim: int) -> DataNorm:
        """No-op statistics for ``obs_dim``-dimensional observations."""
        return cls(
            jnp.zeros(obs_dim, jnp.float32),
            jnp.ones(obs_dim, jnp.float32),
            jnp.float32(1.0),
            jnp.float32(0.0),
        )

    def obs(self, obs: jax.Array) -> jax.Array:
        """Normalized observations (any leading dimensions)."""
        return (obs - self.obs_mean) / self.obs_std

    def batch(self, batch: Transition) -> Transition:
        """A batch with normalized ``obs``, ``next_obs``, ``reward`` (and ``mc_return``).

        A Monte-Carlo return is scaled like the rewards it sums; ``data_norm`` never shifts
        rewards, so that is exact (a shift would add ``shift * sum of discounts``).
        """
        mc = batch.mc_return
        return batch._replace(
            obs=self.obs(batch.obs),
            next_obs=self.obs(batch.next_obs),
            reward=batch.reward * self.reward_scale + self.reward_shift,
            mc_return=None if mc is None else mc * self.reward_scale,
        )


def data_norm(dataset: Any, config: Any) -> DataNorm:
    """The ``DataNorm`` an agent's config asks for, computed from ``dataset``.

    ``config.normalize_observations`` standardizes observations with the dataset's mean and std
    (TD3+BC); ``config.reward_normalization == "return_range"`` scales rewards by
    ``T / (max - min episode return)``, T the longest episode (IQL: 1000 on locomotion).
    """
    norm = DataNorm.identity(dataset.obs_dim)
    if config.normalize_observations:
        mean, std = dataset.obs_stats()
        norm = norm.replace(obs_mean=jnp.asarray(mean), obs_std=jnp.asarray(std))
    mode = config.reward_normalization
    if mode == "return_range":
        norm = norm.replace(reward_scale=jnp.float32(dataset.reward_scale_return_range()))
    elif mode not in REWARD_NORMALIZATIONS:
        raise ConfigError(f"Unknown reward_normalization {mode!r}; use {REWARD_NORMALIZATIONS}.")
    return norm


class DatasetRows(struct.PyTreeNode):
    """A dataset's ``(observation, action)`` rows on the device, for a nearest-row search.

    The squared norms are kept so that a squared distance in the joint space
    ``[beta * s, a]`` is ``beta^2 (|s|^2 - 2 s.s_j + |s_j|^2) + (|a|^2 - 2 a.a_j + |a_j|^2)``:
    the cross terms are matmuls, and ``beta`` may be a traced (sweepable) value.

    Attributes:
        obs: ``[N, obs_dim]`` observations, normalized as the agent sees them (``DataNorm``).
        action: ``[N, action_dim]`` actions in ``[-1, 1]``.
        obs_sq: ``[N]`` squared L2 norms of ``obs``'s rows.
        action_sq: ``[N]`` squared L2 norms of ``action``'s rows.
    """

    obs: jax.Array
    action: jax.Array
    obs_sq: jax.Array
    action_sq: jax.Array

    @classmethod
    def from_arrays(cls, obs: Any, action: Any) -> DatasetRows:
        """Rows from ``[N, obs_dim]`` observations and ``[N, action_dim]`` actions."""
        obs, action = jnp.asarray(obs, jnp.float32), jnp.asarray(action, jnp.float32)
        chex.assert_rank([obs, action], 2)
        chex.assert_equal_shape_prefix([obs, action], 1)
        return cls(obs, action, jnp.sum(obs**2, axis=-1), jnp.sum(action**2, axis=-1))

    @classmethod
    def zeros(cls, num_rows: int, obs_dim: int, action_dim: int) -> DatasetRows:
        """``num_rows`` zero rows: a placeholder until the dataset's rows are set."""
        obs = jnp.zeros((num_rows, obs_dim), jnp.float32)
        return cls.from_arrays(obs, jnp.zeros((num_rows, action_dim), jnp.float32))

    def nearest(
        self, obs: jax.Array, actions: jax.Array, beta: jax.Array | float, chunk_size: int
    ) -> tuple[jax.Array, jax.Array]:
        """Index and squared distance of the row nearest to each query ``[beta * s, a]``.

        An exact brute-force search over all ``N`` rows, ``chunk_size`` rows at a time: a
        ``lax.scan`` keeps each query's smallest distance and the chunk it lies in, then the
        row is found within that chunk (one more ``[B, chunk_size]`` pass). Per chunk a ``min``
        instead of an ``argmin``: XLA's CPU argmin (a two-operand reduction) made the search
        about 8x slower. When ``chunk_size`` does not divide ``N``, the last chunk overlaps the
        one before (rows seen twice change no minimum). Of equally near rows, one is returned.

        Args:
            obs: ``[B, obs_dim]`` query observations (normalized like ``self.obs``).
            actions: ``[B, action_dim]`` query actions.
            beta: the observations' weight in the joint space (may be traced).
            chunk_size: rows compared per scan step (static).

        Returns:
            ``[B]`` int32 row indices and ``[B]`` squared distances.
        """
        chex.assert_rank([obs, actions], 2)
        n = self.obs.shape[0]
        size = min(chunk_size, n)
        beta2 = jnp.asarray(beta, jnp.float32) ** 2
        ones = jnp.ones((obs.shape[0], 1), jnp.float32)
        # d_j - |q|^2 = [-2 beta^2 s, -2 a, beta^2, 1] . [s_j, a_j, |s_j|^2, |a_j|^2]: one matmul.
        query = jnp.concatenate([-2.0 * beta2 * obs, -2.0 * actions, beta2 * ones, ones], -1)
        # Full fp32: on accelerators the default precision (bf16 / TF32 passes) would blur
        # distances between near neighbours.
        hi = jax.lax.Precision.HIGHEST

        def keys(rows: DatasetRows) -> jax.Array:
            sq = jnp.stack([rows.obs_sq, rows.action_sq], -1)
            return jnp.concatenate([rows.obs, rows.action, sq], -1)

        def chunk(carry: tuple[jax.Array, jax.Array], i: jax.Array) -> tuple[Any, None]:
            best_d, best_start = carry
            start = jnp.minimum(i * size, n - size)
            rows = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), self)
            d = jnp.min(jnp.dot(query, keys(rows).T, precision=hi), axis=-1)
            better = d < best_d
            return (jnp.where(better, d, best_d), jnp.where(better, start, best_start)), None

        init = (jnp.full(obs.shape[:1], jnp.inf), jnp.zeros(obs.shape[:1], jnp.int32))
        (_, start), _ = jax.lax.scan(chunk, init, jnp.arange(-(-n // size)))
        candidates = start[:, None] + jnp.arange(size)  # [B, size]: each query's best chunk
        near = keys(jax.tree.map(lambda x: x[candidates], self))
        d = jnp.einsum("bk,bsk->bs", query, near, precision=hi)
        idx = start + jnp.argmin(d, axis=-1).astype(jnp.int32)
        dist = beta2 * jnp.sum((obs - self.obs[idx]) ** 2, -1)
        return idx, dist + jnp.sum((actions - self.action[idx]) ** 2, -1)


def dataset_rows(dataset: Any, norm: DataNorm, action_low: Any, action_high: Any) -> DatasetRows:
    """``dataset``'s rows as an agent with statistics ``norm`` sees them.

    Observations normalized by ``norm``, actions mapped to ``[-1, 1]`` with the env's bounds
    (as ``Dataset.transitions`` does for the replay buffer).
    """
    data = dataset.transitions(action_low, action_high)
    obs = (data.obs - np.asarray(norm.obs_mean)) / np.asarray(norm.obs_std)
    return DatasetRows.from_arrays(obs, data.action)


def check_generative_config(config: Any) -> None:
    """Validation shared by the diffusion and flow agents' configs (IDQL, Diffusion-QL, FQL).

    Raises:
        ConfigError: naming the field and the accepted values.
    """
    name = type(config).__name__
    if getattr(config, "time_dim", 2) % 2:
        raise ConfigError(
            f"{name}.time_dim must be even (sines and cosines), got {config.time_dim}; "
            "set --time-dim to e.g. 16."
        )
    if hasattr(config, "actor_architecture"):
        check_choice(config, "actor_architecture", ("ln_resnet", "mlp"))
    if getattr(config, "actor_architecture", "mlp") == "ln_resnet":
        if len(set(config.actor_hidden_dims)) != 1:
            raise ConfigError(
                f"{name}.actor_hidden_dims={config.actor_hidden_dims} with actor_architecture="
                "'ln_resnet' must repeat one width (the residual stream's); pass e.g. "
                "--actor-hidden-dims 256 256 256."
            )
    if hasattr(config, "actor_ema_tau"):
        check_range(config, "actor_ema_tau", 0.0, 1.0, low_open=True)


# Candidate selection: IDQL and Diffusion-QL sample several actions per observation and keep
# one by its value. The per-observation keys of their deterministic evaluation live in
# ``jaxrl.generative`` (EXPO, an online agent, evaluates the same way).
def repeat_rows(obs: jax.Array, num: int) -> jax.Array:
    """``[..., D] -> [..., num, D]``: each observation repeated for ``num`` candidate actions."""
    return jnp.broadcast_to(obs[..., None, :], (*obs.shape[:-1], num, obs.shape[-1]))


def select_by_value(
    actions: jax.Array, values: jax.Array, key: jax.Array | None = None, temperature: float = 0.0
) -> jax.Array:
    """Pick one of ``N`` candidate actions per row by their values.

    ``actions`` ``[..., N, A]``, ``values`` ``[..., N]``. ``temperature = 0`` takes the argmax
    (IDQL's ``eval_actions``); ``temperature > 0`` samples with probabilities
    ``softmax(values / temperature)`` (Diffusion-QL's action selection with temperature 1).
    """
    chex.assert_equal_shape_prefix([actions, values], values.ndim)
    if temperature > 0.0:
        if key is None:
            raise ValueError("select_by_value with temperature > 0 needs a key.")
        idx = jax.random.categorical(key, values / temperature, axis=-1)
    else:
        idx = jnp.argmax(values, axis=-1)
    return jnp.take_along_axis(actions, idx[..., None, None], axis=-2)[..., 0, :]
