"""Soft Actor-Critic (Haarnoja et al., 2018, arXiv:1812.05905).

A Q ensemble and automatic entropy tuning in a frozen pytree: ``update`` is pure, so it can be
scanned, jitted and vmapped.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import rl
from jaxrl.config import ConfigError, check_positive, check_range
from jaxrl.networks import (
    EnsembleQ,
    TanhGaussianActor,
    Temperature,
    gradient_step,
    make_train_state,
)
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def critic_loss(
    critic_params: Params, agent: SAC, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Soft Bellman residual, SAC eq. 5, with clipped double-Q (or REDQ subset) targets."""
    key_pi, key_sub = jax.random.split(key)
    next_dist = agent.actor.apply_fn(agent.actor.params, batch.next_obs)
    next_actions, next_log_probs = next_dist.sample_and_log_prob(key_pi)
    next_qs = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, next_actions)
    next_q = rl.subsample_ensemble(key_sub, next_qs, agent.config.num_min_qs)
    if agent.config.backup_entropy:
        next_q = next_q - agent.temp.apply_fn(agent.temp.params) * next_log_probs
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_q, agent.hparams["discount"])
    )
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    loss = rl.ensemble_td_loss(qs, target) * 0.5
    return loss, {"critic/loss": loss, "critic/q_mean": qs.mean(), "critic/target": target.mean()}


def actor_loss(
    actor_params: Params, agent: SAC, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Policy KL objective, SAC eq. 7: ``E[alpha log pi(a|s) - Q(s, a)]``.

    ``Q`` is the minimum over the critics (as in the authors' code) or their mean (REDQ/RLPD),
    by ``config.policy_q``.
    """
    dist = agent.actor.apply_fn(actor_params, batch.obs)
    actions, log_probs = dist.sample_and_log_prob(key)
    qs = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)
    q = qs.min(axis=0) if agent.config.policy_q == "min" else qs.mean(axis=0)
    alpha = agent.temp.apply_fn(agent.temp.params)
    loss = jnp.mean(alpha * log_probs - q)
    return loss, {"actor/loss": loss, "actor/entropy": -log_probs.mean()}


def temperature_loss(
    temp_params: Params, agent: SAC, entropy: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Automatic entropy tuning, SAC eq. 18: ``alpha * (H(pi) - target_entropy)``."""
    alpha = agent.temp.apply_fn(temp_params)
    loss = alpha * (entropy - agent.hparams["target_entropy"])
    return loss, {"temp/loss": loss, "temp/alpha": alpha}


# -------------------------------------------------------------------------------------- the agent


class SAC(struct.PyTreeNode):
    """SAC state: networks, optimizer states, target critic, RNG and sweepable hyperparameters."""

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    target_critic_params: Params
    temp: TrainState
    hparams: dict[str, jax.Array]
    config: SACConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[SAC, InfoDict]:
        """One gradient step on critic, actor and temperature, then the Polyak target update."""
        rng, k_critic, k_actor = jax.random.split(self.rng, 3)
        critic, info = gradient_step(self.critic, critic_loss, self, batch, k_critic)
        target = rl.polyak_update(critic.params, self.target_critic_params, self.hparams["tau"])
        agent = self.replace(rng=rng, critic=critic, target_critic_params=target)
        actor, actor_info = gradient_step(agent.actor, actor_loss, agent, batch, k_actor)
        entropy = actor_info["actor/entropy"]
        temp, temp_info = gradient_step(agent.temp, temperature_loss, agent, entropy)
        return agent.replace(actor=actor, temp=temp), {**info, **actor_info, **temp_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Stochastic actions in [-1, 1] for exploration."""
        return self.actor.apply_fn(self.actor.params, obs).sample(rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions (tanh of the mean) in [-1, 1]."""
        return self.actor.apply_fn(self.actor.params, obs).mode()

    @classmethod
    def create(
        cls, config: SACConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> SAC:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, *keys = jax.random.split(jax.random.key(seed), 4)
        actor, critic, target, temp, hparams = init_networks(
            config, obs_example, action_example, *keys
        )
        return cls(rng, actor, critic, target, temp, hparams, config)


def init_networks(
    config: SACConfig,
    obs_example: jax.Array,
    action_example: jax.Array,
    k_actor: jax.Array,
    k_critic: jax.Array,
    k_temp: jax.Array,
) -> tuple[TrainState, TrainState, Params, TrainState, dict[str, jax.Array]]:
    """SAC's actor, critic ensemble, target critic, temperature and float hyperparameters.

    Shared by every SAC-based agent (CQL, ...). ``config`` needs SAC's network and optimizer
    fields (``hidden_dims``, ``num_qs``, ``critic_layer_norm``, learning rates, ``discount``,
    ``tau``, ``init_temperature``, ``target_entropy``).
    """
    action_dim = action_example.shape[-1]
    obs, act = obs_example[None], action_example[None]
    actor = make_train_state(
        TanhGaussianActor(action_dim, config.hidden_dims), k_actor, config.actor_lr, obs
    )
    critic_def = EnsembleQ(config.hidden_dims, config.num_qs, config.critic_layer_norm)
    critic = make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
    temp = make_train_state(Temperature(config.init_temperature), k_temp, config.temp_lr)
    target_entropy = config.target_entropy
    if target_entropy is None:
        target_entropy = -float(action_dim)
    hparams = {
        "discount": jnp.float32(config.discount),
        "tau": jnp.float32(config.tau),
        "target_entropy": jnp.float32(target_entropy),
    }
    target = jax.tree.map(jnp.copy, critic.params)  # distinct buffers, so both can be donated
    return actor, critic, target, temp, hparams


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class SACConfig:
    """SAC hyperparameters; defaults are the paper's MuJoCo settings (Haarnoja et al., 2018)."""

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic ensemble."""
    temp_lr: float = 3e-4
    """Adam learning rate of the entropy temperature."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    num_qs: int = 2
    """Number of Q-functions in the critic ensemble."""
    num_min_qs: int | None = None
    """Take the target minimum over a random subset of this many critics (REDQ/RLPD); None = all."""
    policy_q: Literal["min", "mean"] = "min"
    """How the actor loss reduces the critic ensemble: 'min' (SAC) or 'mean' (REDQ/RLPD)."""
    critic_layer_norm: bool = False
    """LayerNorm in the critic's hidden layers (RLPD)."""
    discount: float = 0.99
    """Discount factor gamma."""
    tau: float = 0.005
    """Polyak averaging coefficient of the target critic."""
    init_temperature: float = 1.0
    """Initial entropy temperature alpha."""
    target_entropy: float | None = None
    """Target policy entropy; None = -action_dim."""
    backup_entropy: bool = True
    """Include the entropy bonus in the TD target."""
    batch_size: int = 256
    """Minibatch size of each gradient step."""
    utd_ratio: int = 1
    """Gradient steps per environment step (update-to-data ratio)."""
    buffer_size: int = 1_000_000
    """Replay buffer capacity in transitions."""
    learning_starts: int = 5_000
    """Uniform-random environment steps before learning starts."""

    def __post_init__(self) -> None:
        check_positive(
            self,
            "actor_lr",
            "critic_lr",
            "temp_lr",
            "hidden_dims",
            "num_qs",
            "num_min_qs",
            "init_temperature",
            "batch_size",
            "utd_ratio",
            "buffer_size",
        )
        check_range(self, "discount", 0.0, 1.0)
        check_range(self, "tau", 0.0, 1.0, low_open=True)
        check_range(self, "learning_starts", 0, float("inf"))
        if self.num_min_qs is not None and self.num_min_qs > self.num_qs:
            raise ConfigError(
                f"num_min_qs ({self.num_min_qs}) cannot exceed num_qs ({self.num_qs}); lower "
                "--num-min-qs or raise --num-qs."
            )


@partial(dataclasses.dataclass, frozen=True)
class RLPDConfig(SACConfig):
    """RLPD (Ball et al., 2023, arXiv:2302.02948): SAC trained online with prior data.

    Only defaults change (the paper's locomotion settings): LayerNorm critics, an ensemble of 10
    with the target's minimum over a random pair, the actor on the ensemble mean, and 20 updates
    per env step. The symmetric sampling (half of every minibatch from ``--dataset``) is the
    loop's ``--offline-ratio``, 0.5 by default.
    """

    # Redeclared fields keep SACConfig's docstrings (tyro reads them from the parent class).
    num_qs: int = 10
    num_min_qs: int | None = 2
    policy_q: Literal["min", "mean"] = "mean"
    critic_layer_norm: bool = True
    utd_ratio: int = 20
