"""Soft Actor-Critic (Haarnoja et al., 2018, arXiv:1812.05905).

A Q ensemble and automatic entropy tuning in a frozen pytree: ``update`` is pure, so it can be
scanned, jitted and vmapped.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.config import ConfigError, OffPolicyFields, check_positive
from jaxrl.types import Batch, InfoDict, LossFn, Params

# ----------------------------------------------------------------------------------------- losses


def soft_td_target(agent: Any, batch: Batch, key: jax.Array) -> jax.Array:
    """SAC's TD target ``r + gamma (1 - d) (min_j Qtarg_j(s', a') [- alpha log pi(a'|s')])``.

    ``a' ~ pi(s')`` from the current actor; the entropy term only with ``backup_entropy``. Shared
    by the SAC-based agents whose critic losses weigh the rows (H2O). Returns ``[B]``, without
    gradient.
    """
    key_pi, key_sub = jax.random.split(key)
    next_dist = agent.actor.apply_fn(agent.actor.params, batch.next_obs)
    next_actions, next_log_probs = next_dist.sample_and_log_prob(key_pi)
    params = rl.ensemble_subset(key_sub, agent.target_critic_params, agent.config.num_min_qs)
    next_q = rl.min_over_ensemble(agent.critic.apply_fn(params, batch.next_obs, next_actions))
    if agent.config.backup_entropy:
        next_q = next_q - agent.temp.apply_fn(agent.temp.params) * next_log_probs
    return jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_q, agent.hparams["discount"])
    )


def critic_loss(
    critic_params: Params, agent: SAC, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Soft Bellman residual, SAC eq. 5, with clipped double-Q (or REDQ subset) targets."""
    target = soft_td_target(agent, batch, key)
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


def update_step(
    agent: Any,
    batch: Batch,
    critic_loss_fn: LossFn = critic_loss,
    actor_loss_fn: LossFn = actor_loss,
) -> tuple[Any, InfoDict]:
    """SAC's update (``SAC.update``) for any agent with SAC's networks, given its two losses.

    SAC-based agents (CQL) call it with their own critic and actor losses; ``agent`` needs
    SAC's fields (``rng``, ``actor``, ``critic``, ``target_critic_params``, ``temp``,
    ``hparams``) and config fields (``utd_ratio``, ``delayed_actor_update``).
    """
    rng, k_critic, k_actor = jax.random.split(agent.rng, 3)
    critic, info = nets.gradient_step(agent.critic, critic_loss_fn, agent, batch, k_critic)
    target = rl.polyak_update(critic.params, agent.target_critic_params, agent.hparams["tau"])
    agent = agent.replace(rng=rng, critic=critic, target_critic_params=target)
    every = agent.config.utd_ratio if agent.config.delayed_actor_update else 1
    due = True if every == 1 else critic.step % every == 0
    agent, actor_info = nets.when(
        due, lambda a: actor_and_temperature_step(a, batch, k_actor, actor_loss_fn), agent
    )
    return agent, {**info, **actor_info}


def actor_and_temperature_step(
    agent: Any,
    batch: Batch,
    key: jax.Array,
    actor_loss_fn: LossFn = actor_loss,
    temp_loss_fn: LossFn = temperature_loss,
) -> tuple[Any, InfoDict]:
    """An actor step, then a temperature step on the entropy the actor loss reported.

    ``actor_loss_fn(params, agent, batch, key)`` must report ``actor/entropy``;
    ``temp_loss_fn(params, agent, entropy)`` is SAC's ``temperature_loss`` by default.
    """
    actor, actor_info = nets.gradient_step(agent.actor, actor_loss_fn, agent, batch, key)
    entropy = actor_info["actor/entropy"]
    temp, temp_info = nets.gradient_step(agent.temp, temp_loss_fn, agent, entropy)
    return agent.replace(actor=actor, temp=temp), {**actor_info, **temp_info}


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
        """A critic step and the Polyak target update, then an actor and a temperature step.

        With ``config.delayed_actor_update`` (RLPD) the actor and temperature step only on every
        ``utd_ratio``-th critic step (counted by ``critic.step``), as the RLPD reference takes
        ``utd_ratio`` critic steps and then one actor and one temperature step per env step;
        their info values are 0 on the other calls (not NaN, which the loops count as
        non-finite; the loops log the last call of a group, which steps the actor).
        """
        return update_step(self, batch)

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
            config,
            obs_example,
            action_example,
            *keys,
            config.target_entropy_scale,
            config.actor_observation_size,
        )
        return cls(rng, actor, critic, target, temp, hparams, config)


def init_networks(
    config: SACConfig,
    obs_example: jax.Array,
    action_example: jax.Array,
    k_actor: jax.Array,
    k_critic: jax.Array,
    k_temp: jax.Array,
    target_entropy_scale: float = 1.0,
    actor_observation_size: int = 0,
) -> tuple[TrainState, TrainState, Params, TrainState, dict[str, jax.Array]]:
    """SAC's actor, critic ensemble, target critic, temperature and float hyperparameters.

    Shared by every SAC-based agent (CQL, ...). ``config`` needs SAC's network and optimizer
    fields (``hidden_dims``, ``num_qs``, ``critic_layer_norm``, learning rates, ``discount``,
    ``tau``, ``init_temperature``, ``target_entropy``). Without a ``target_entropy`` the target
    is ``-target_entropy_scale * action_dim``. With ``actor_observation_size`` the actor reads
    only that many leading observation features (``nets.observing``).
    """
    action_dim = action_example.shape[-1]
    actor_def = nets.observing(
        nets.TanhGaussianActor(action_dim, config.hidden_dims), actor_observation_size
    )
    actor = nets.make_train_state(actor_def, k_actor, config.actor_lr, obs_example[None])
    critic, target, temp, hparams = init_critic_and_temperature(
        config, obs_example, action_example, k_critic, k_temp, target_entropy_scale
    )
    return actor, critic, target, temp, hparams


def init_critic_and_temperature(
    config: SACConfig,
    obs_example: jax.Array,
    action_example: jax.Array,
    k_critic: jax.Array,
    k_temp: jax.Array,
    target_entropy_scale: float = 1.0,
) -> tuple[TrainState, Params, TrainState, dict[str, jax.Array]]:
    """``init_networks`` without the actor: critic ensemble, target, temperature, hparams.

    For agents with SAC's critic and temperature but another actor (EXPO's edit policy).
    """
    action_dim = action_example.shape[-1]
    obs, act = obs_example[None], action_example[None]
    critic_def = nets.EnsembleQ(config.hidden_dims, config.num_qs, config.critic_layer_norm)
    critic = nets.make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
    temp = nets.make_train_state(nets.Temperature(config.init_temperature), k_temp, config.temp_lr)
    target_entropy = config.target_entropy
    if target_entropy is None:
        target_entropy = -float(action_dim) * target_entropy_scale
    hparams = {
        "discount": jnp.float32(config.discount),
        "tau": jnp.float32(config.tau),
        "target_entropy": jnp.float32(target_entropy),
    }
    target = jax.tree.map(jnp.copy, critic.params)  # distinct buffers, so both can be donated
    return critic, target, temp, hparams


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class SACConfig(OffPolicyFields):
    """SAC hyperparameters; defaults are the paper's MuJoCo settings (Haarnoja et al., 2018)."""

    learning_starts: int = 5_000  # uniformly random steps before the first update

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
    init_temperature: float = 1.0
    """Initial entropy temperature alpha."""
    actor_observation_size: int = 0
    """The actor sees the first N observation features, the critic all (0: all); `jaxrl train` sets
    it for envs with privileged=true (asymmetric actor-critic)."""
    target_entropy: float | None = None
    """Target policy entropy; None = -target_entropy_scale * action_dim."""
    target_entropy_scale: float = 1.0
    """Default target entropy per action dimension, negated: 1 (SAC) or 1/2 (RLPD)."""
    delayed_actor_update: bool = False
    """Step actor and temperature once per utd_ratio critic steps (RLPD) instead of on each."""
    backup_entropy: bool = True
    """Include the entropy bonus in the TD target."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            "actor_lr",
            "critic_lr",
            "temp_lr",
            "hidden_dims",
            "num_qs",
            "num_min_qs",
            "init_temperature",
            "target_entropy_scale",
        )
        if self.num_min_qs is not None and self.num_min_qs > self.num_qs:
            raise ConfigError(
                f"num_min_qs ({self.num_min_qs}) cannot exceed num_qs ({self.num_qs}); lower "
                "--num-min-qs or raise --num-qs."
            )


@partial(dataclasses.dataclass, frozen=True)
class RLPDConfig(SACConfig):
    """RLPD (Ball et al., 2023, arXiv:2302.02948): SAC trained online with prior data.

    Only defaults change (the paper's locomotion settings and the authors' code): LayerNorm
    critics, an ensemble of 10 with the target's minimum over a random pair, the actor on the
    ensemble mean, 20 critic updates per env step followed by one actor and one temperature
    update, and a target entropy of -action_dim / 2. The symmetric sampling (half of every
    minibatch from ``--dataset``) is the loop's ``--offline-ratio``, 0.5 by default.
    """

    # Redeclared fields keep SACConfig's docstrings (tyro reads them from the parent class).
    num_qs: int = 10
    num_min_qs: int | None = 2
    policy_q: Literal["min", "mean"] = "mean"
    critic_layer_norm: bool = True
    utd_ratio: int = 20
    target_entropy_scale: float = 0.5
    delayed_actor_update: bool = True


@partial(dataclasses.dataclass, frozen=True)
class SACFastConfig(SACConfig):
    """``sac-fast``: SAC with RLPD's critic ensemble and a higher update ratio (sample efficiency).

    Only defaults change: LayerNorm critics; an ensemble of 3 whose TD target takes the minimum
    of a random pair and whose actor loss takes their mean (RLPD, Ball et al., 2023, uses 10);
    4 critic steps on minibatches of 128 per env step, followed by one actor and one temperature
    step (RLPD's schedule). That is the critic FLOPs of 2 steps on 256 rows spent on twice the
    updates, as small-batch studies of deep RL suggest (Obando-Ceron et al., 2023). Unlike RLPD
    it keeps SAC's target entropy (-action_dim). Chosen by measurement
    (``benchmarks/sac_fast_screen.py``, tables ``sac_fast_screen*.md``): in 30k-step runs,
    stepping the actor once per env step beat stepping it with every critic step, and 3 critics
    cost less than 4 at about the same return. At 100k env steps on Hopper-v5 (seeds 0-2), the
    first preset (2 steps on 256 rows, actor on the mean) scored 877 against SAC's 2,055; 4 steps
    on 128 rows with the actor on the minimum 1,146, 1,568 and 3,265 (its evaluations swung
    between ~800 and ~3,300 once it hopped); with the actor on the mean, 3,099, 1,732 and 3,129.
    """

    num_qs: int = 3
    num_min_qs: int | None = 2
    policy_q: Literal["min", "mean"] = "mean"
    critic_layer_norm: bool = True
    utd_ratio: int = 4
    batch_size: int = 128
    delayed_actor_update: bool = True
