"""Diffusion-QL (Wang, Hunt & Zhou, 2023, arXiv:2208.06193).

"Diffusion Policies as an Expressive Policy Class for Offline Reinforcement Learning": the policy
is a conditional diffusion model trained with its DDPM loss (behavior cloning) plus a Q-learning
term. Actions are sampled through the whole (short, T = 5) reverse chain and the critic's value of
them is maximized by backpropagating through every denoising step. The critics are TD3-style twins
bootstrapping from actions the moving-average policy samples at ``s'``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import chex
import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import generative as gen
from jaxrl import rl
from jaxrl.config import OfflineFields, check_choice, check_positive, check_range
from jaxrl.networks import EnsembleQ, gradient_step, hparam_leaves, make_train_state
from jaxrl.offline.common import (
    DataNorm,
    check_generative_config,
    map_rows,
    repeat_rows,
    select_by_value,
)
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def max_q_backup_value(next_qs: jax.Array) -> jax.Array:
    """``min_i max_n Q'_i(s', a'_n)``: each critic's best sampled action, then the critics' minimum.

    The order of the authors' ``max_q_backup`` (each target critic's maximum over the candidates,
    then the minimum of the two), which bootstraps from at least the value of the minimum taken
    the other way round. ``next_qs`` is ``[num_qs, ..., N]``; returns ``[...]``.
    """
    chex.assert_rank(next_qs, {2, 3, 4})
    return jnp.min(jnp.max(next_qs, axis=-1), axis=0)


def critic_loss(
    critic_params: Params, agent: DiffusionQL, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Double-Q regression onto ``r + gamma (1 - d) min_i Q'_i(s', a')``, ``a' ~ pi_ema(s')``.

    Diffusion-QL eq. 4; with ``max_q_backup`` the target is ``max_q_backup_value`` over 10
    sampled next actions. Each critic's squared error is averaged over the batch and the
    critics' errors are summed.
    """
    if agent.config.max_q_backup:  # the best of 10 sampled next actions (the paper's option)
        next_obs = repeat_rows(batch.next_obs, 10)
        next_actions = agent.sample_chain(agent.actor_ema_params, next_obs, key)
        next_qs = agent.critic.apply_fn(agent.target_critic_params, next_obs, next_actions)
        next_v = max_q_backup_value(next_qs)
    else:
        next_actions = agent.sample_chain(agent.actor_ema_params, batch.next_obs, key)
        next_qs = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, next_actions)
        next_v = rl.min_over_ensemble(next_qs)
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_v, agent.hparams["discount"])
    )
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    loss = rl.ensemble_td_loss(qs, target)
    return loss, {"critic/loss": loss, "critic/q_mean": qs.mean(), "critic/target": target.mean()}


def actor_loss(
    actor_params: Params, agent: DiffusionQL, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``L_bc + eta * L_q`` with ``L_q = -E[Q_i(s, a_0)] / E|Q_j(s, a_0)|``, Diffusion-QL eq. 3.

    ``L_bc`` is the DDPM loss averaged over batch and action dimensions; ``a_0`` is sampled
    through the reverse chain with gradients; ``i`` is one of the two critics at random and the
    normalizer ``E|Q_j|`` uses the other one, without gradient (the authors' code).
    """
    k_bc, k_sample, k_pick = jax.random.split(key, 3)
    fn = partial(agent.actor.apply_fn, actor_params, batch.obs)
    bc = jnp.mean(gen.ddpm_loss(fn, k_bc, batch.action, agent.schedule)) / agent.action_dim
    actions = agent.sample_chain(actor_params, batch.obs, k_sample)
    qs = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)
    i = jax.random.bernoulli(k_pick).astype(jnp.int32)
    q, q_other = qs[i], qs[1 - i]
    q_loss = -q.mean() / jax.lax.stop_gradient(jnp.abs(q_other).mean())
    loss = bc + agent.hparams["eta"] * q_loss
    return loss, {"actor/loss": loss, "actor/bc": bc, "actor/q_loss": q_loss, "actor/q": q.mean()}


# -------------------------------------------------------------------------------------- the agent


class DiffusionQL(struct.PyTreeNode):
    """Diffusion-QL state: diffusion actor and its moving average, twin critics and targets.

    Sweepable leaves: the learning rates (in each ``opt_state``) and ``hparams`` (``discount``,
    ``tau``, ``eta``, ``actor_ema_tau``).
    """

    rng: jax.Array
    actor: TrainState
    actor_ema_params: Params
    critic: TrainState
    target_critic_params: Params
    step: jax.Array
    hparams: dict[str, jax.Array]
    norm: DataNorm
    action_dim: int = struct.field(pytree_node=False)
    config: DiffusionQLConfig = struct.field(pytree_node=False)

    @property
    def schedule(self) -> gen.DiffusionSchedule:
        """The variance-preserving schedule of ``config.diffusion_steps`` steps."""
        return gen.vp_schedule(self.config.diffusion_steps)

    def sample_chain(self, actor_params: Params, obs: jax.Array, key: jax.Array) -> jax.Array:
        """One DDPM sample per (normalized) observation row with the given actor parameters.

        The config's ``sampler``: 'posterior' (the authors' clipped-``x_0`` posterior steps) or
        'ancestral' (IDQL's clipped iterate with variance ``beta_t``).
        """
        fn = partial(self.actor.apply_fn, actor_params, obs)
        shape = (*obs.shape[:-1], self.action_dim)
        if self.config.sampler == "posterior":
            return gen.ddpm_posterior_sample(fn, key, shape, self.schedule)
        return gen.ddpm_sample(fn, key, shape, self.schedule)

    def update(self, batch: Batch) -> tuple[DiffusionQL, InfoDict]:
        """Critic step, actor step (through the updated critic), then the EMA and target updates."""
        batch = self.norm.batch(batch)
        rng, k_critic, k_actor = jax.random.split(self.rng, 3)
        critic, info = gradient_step(self.critic, critic_loss, self, batch, k_critic)
        agent = self.replace(critic=critic)
        actor, actor_info = gradient_step(agent.actor, actor_loss, agent, batch, k_actor)
        cfg = self.config
        ema = rl.scheduled_polyak(
            actor.params,
            self.actor_ema_params,
            self.step,
            self.hparams["actor_ema_tau"],
            cfg.actor_ema_every,
            cfg.actor_ema_start,
        )
        target = rl.polyak_update(critic.params, self.target_critic_params, self.hparams["tau"])
        agent = agent.replace(
            rng=rng,
            actor=actor,
            actor_ema_params=ema,
            target_critic_params=target,
            step=self.step + 1,
        )
        return agent, {**info, **actor_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """``num_samples`` candidates; one drawn with probability ``softmax(Q / temperature)``."""
        k_sample, k_pick = jax.random.split(rng)
        obs = repeat_rows(self.norm.obs(obs), self.config.num_samples)
        actions = self.sample_chain(self.actor.params, obs, k_sample)
        q = jnp.min(self.critic.apply_fn(self.target_critic_params, obs, actions), axis=0)
        return select_by_value(actions, q, k_pick, self.config.selection_temperature)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """As ``sample_actions``, noise seeded by each observation: a deterministic policy."""
        return map_rows(self.sample_actions, self.rng, obs)

    @classmethod
    def create(
        cls,
        config: DiffusionQLConfig,
        obs_example: jax.Array,
        action_example: jax.Array,
        seed: int | jax.Array,
    ) -> DiffusionQL:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic = jax.random.split(jax.random.key(seed), 3)
        obs, act = obs_example[None], action_example[None]
        dim = action_example.shape[-1]
        actor_def = gen.DenoiserNet(dim, config.hidden_dims, time_dim=config.time_dim)
        actor, ema = gen.init_diffusion_actor(
            actor_def, k_actor, config.actor_lr, obs, act, config.max_steps, config.max_grad_norm
        )
        critic_def = EnsembleQ(config.hidden_dims, 2, activation=gen.mish)
        opt = {"cosine_decay_steps": gen.cosine_horizon(config.max_steps)}
        opt["max_grad_norm"] = config.max_grad_norm
        critic = make_train_state(critic_def, k_critic, config.critic_lr, obs, act, **opt)
        hparams = hparam_leaves(config, "discount", "tau", "eta", "actor_ema_tau")
        target, norm = jax.tree.map(jnp.copy, critic.params), DataNorm.identity(obs.shape[-1])
        return cls(rng, actor, ema, critic, target, jnp.int32(0), hparams, norm, dim, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class DiffusionQLConfig(OfflineFields):
    """Diffusion-QL hyperparameters; defaults are the authors' hopper/halfcheetah-medium settings.

    From Zhendong-Wang/Diffusion-Policies-for-Offline-RL: 3x256 mish MLPs, T = 5 VP steps,
    eta = 1, gradient norm 9, cosine learning-rate decay, EMA 0.995 every 5 steps from step
    1,000, 50 candidates picked by softmax(Q) at action time. The reverse chain is the authors'
    (``agents/diffusion.py``): predict the noise, reconstruct ``x_0`` and clip it to [-1, 1],
    step with the posterior mean and variance ``beta~_t``; ``max_q_backup`` takes each target
    critic's maximum over the sampled next actions, then the minimum over critics.
    """

    actor_lr: float = 3e-4
    """Adam learning rate of the diffusion actor (before the cosine decay)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics (before the cosine decay)."""
    max_steps: int | None = None
    """Horizon of the cosine decays; None = the run's --total-steps (1M outside a run); 0 = no
    decay."""
    max_grad_norm: float | None = 9.0
    """Global gradient-norm clip of actor and critics (per dataset in the paper; None = off)."""
    hidden_dims: tuple[int, ...] = (256, 256, 256)
    """Hidden layer widths of the noise network and the critics."""
    time_dim: int = 16
    """Width of the sinusoidal diffusion-step embedding."""
    diffusion_steps: int = 5
    """Diffusion steps T of the variance-preserving schedule (training and sampling)."""
    sampler: Literal["posterior", "ancestral"] = "posterior"
    """Reverse chain: 'posterior' (clip x0, variance beta~_t; authors) or 'ancestral' (IDQL's)."""
    eta: float = 1.0
    """Weight of the normalized Q term in the actor loss (0 = diffusion behavior cloning)."""
    num_samples: int = 50
    """Candidates drawn per observation at action time."""
    selection_temperature: float = 1.0
    """Softmax temperature over the candidates' Q values (0 = argmax)."""
    actor_ema_tau: float = 0.005
    """Step of the actor's moving average used for target actions (1 - the authors' 0.995)."""
    actor_ema_every: int = 5
    """Updates between moving-average steps."""
    actor_ema_start: int = 1000
    """Updates before the moving average starts following the actor."""
    max_q_backup: bool = False
    """Bootstrap from min over critics of each one's max over 10 next actions (AntMaze setting)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            *("actor_lr", "critic_lr", "max_grad_norm", "hidden_dims", "time_dim"),
            *("diffusion_steps", "num_samples", "actor_ema_every"),
        )
        check_generative_config(self)
        if self.max_steps is not None:
            check_range(self, "max_steps", 0, float("inf"))
        check_choice(self, "sampler", ("posterior", "ancestral"))
        check_range(self, "eta", 0.0, float("inf"))
        check_range(self, "selection_temperature", 0.0, float("inf"))
        check_range(self, "actor_ema_start", 0, float("inf"))
