"""Pieces every offline agent shares: fixed dataset statistics applied inside the agent.

An offline agent holds a ``DataNorm`` (field ``norm``). It starts as the identity; the offline loop
replaces it with statistics of the dataset when the agent's config asks for observation or reward
normalization. Because the agent applies it itself (to batches in ``update`` and to observations
in ``sample_actions`` / ``eval_actions``), raw observations and rewards flow everywhere else: the
buffer, online fine-tuning, evaluation and exported policies need no extra wrapper.

Also here: the config checks the diffusion and flow agents share, and candidate selection (IDQL
and Diffusion-QL sample several actions per observation and keep one by its value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.config import REWARD_NORMALIZATIONS, ConfigError, check_choice, check_range
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
# one by its value; per-observation keys make a row's action independent of the batch.
def observation_key(key: jax.Array, obs: jax.Array) -> jax.Array:
    """``key`` folded with a hash of the bits of one ``[D]`` observation.

    Evaluation must be a deterministic function of the observation, but a sampler run with one
    fixed noise vector at every step is a fixed quantile of the policy, not a sample of it (on
    Pendulum a diffusion BC policy evaluated that way spins at about -1,300 while its samples
    score like the data, about -670). Seeding the noise with the observation keeps both: equal
    observations get equal actions, and successive states get independent noise.
    """
    bits = jax.lax.bitcast_convert_type(obs.astype(jnp.float32), jnp.uint32)
    mult = jnp.uint32(2654435761) * (jnp.arange(obs.shape[-1], dtype=jnp.uint32) + 1)
    return jax.random.fold_in(key, jnp.sum(bits * mult, dtype=jnp.uint32))


def map_rows(fn: Callable[[jax.Array, jax.Array], jax.Array], key: jax.Array, obs: jax.Array):
    """``fn(o, observation_key(key, o))`` for every ``[D]`` row ``o`` of ``obs`` (any leading dims).

    The deterministic evaluation of a sampling policy: each row's action depends only on that
    observation and ``key``, not on the batch it arrives in.
    """
    flat = obs.reshape(-1, obs.shape[-1])
    out = jax.vmap(lambda o: fn(o, observation_key(key, o)))(flat)
    return out.reshape(*obs.shape[:-1], out.shape[-1])


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
