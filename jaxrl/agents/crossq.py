"""CrossQ (Bhatt, Palenicek et al., ICLR 2024): SAC with batch renormalization and no target net.

No target network: the critic sees ``(s, a)`` and ``(s', a')`` in one joint forward pass, so its
batch-renormalization layers normalize both with the statistics of their mixture, and the TD
target is the same pass's ``(s', a')`` half without gradient. The actor also has batch
renormalization; both keep running statistics (``actor_stats``, ``critic_stats``) as agent
state, so they checkpoint, resume and vmap with everything else. The update order follows SBX's
``CrossQ`` (the side-by-side anchor): a critic step every call, then an actor and a temperature
step every ``policy_delay`` calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.config import OffPolicyFields, check_positive, check_range
from jaxrl.distributions import TanhNormal
from jaxrl.types import Batch, InfoDict, Params

# --------------------------------------------------------------------------------------- networks


class RenormCritic(nn.Module):
    """``num_qs`` Q-networks on ``nets.RenormMLP``; returns ``[num_qs, ...]``."""

    hidden_dims: Sequence[int]
    num_qs: int
    momentum: float
    warmup_steps: int

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, train: bool = False) -> jax.Array:
        """Q-values of every member for each (obs, action) row."""
        mlp = nets.ensemble(nets.RenormMLP, self.num_qs)
        q = mlp(self.hidden_dims, 1, self.momentum, self.warmup_steps)
        return q(jnp.concatenate([obs, action], axis=-1), train)[..., 0]


class RenormActor(nn.Module):
    """A ``nets.RenormMLP`` torso and SAC's tanh-Gaussian heads (``nets.gaussian_head``)."""

    action_dim: int
    hidden_dims: Sequence[int]
    momentum: float
    warmup_steps: int

    @nn.compact
    def __call__(self, obs: jax.Array, train: bool = False) -> TanhNormal:
        """Action distribution for ``obs``."""
        h = nets.RenormMLP(self.hidden_dims, None, self.momentum, self.warmup_steps)(obs, train)
        return nets.gaussian_head(h, self.action_dim, -5.0, 2.0)


def with_stats(params: Params, stats: Params) -> dict:
    """The variables of a network with running statistics: its params and ``batch_stats``."""
    return {**params, "batch_stats": stats}


# ----------------------------------------------------------------------------------------- losses


def critic_loss(
    critic_params: Params,
    agent: CrossQ,
    batch: Batch,
    next_actions: jax.Array,
    next_log_probs: jax.Array,
) -> tuple[jax.Array, tuple[InfoDict, Params]]:
    """SAC's soft Bellman residual (SAC eq. 5) through CrossQ's joint pass of (s, a) and (s', a').

    The target ``r + gamma (1 - d) (min_j Q_j(s', a') - alpha log pi(a'|s'))`` comes from the
    same forward pass as ``Q(s, a)``, without gradient; ``a' ~ pi(s')`` was drawn with the
    actor's running statistics. Returns the new critic statistics beside the info.
    """
    obs = jnp.concatenate([batch.obs, batch.next_obs])
    actions = jnp.concatenate([batch.action, next_actions])
    variables = with_stats(critic_params, agent.critic_stats)
    qs, updates = agent.critic.apply_fn(variables, obs, actions, True, mutable=["batch_stats"])
    q, next_q = jnp.split(qs, 2, axis=1)
    alpha = agent.temp.apply_fn(agent.temp.params)
    next_v = next_q.min(axis=0) - alpha * next_log_probs
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_v, agent.hparams["discount"])
    )
    loss = rl.ensemble_td_loss(q, target) * 0.5
    info = {"critic/loss": loss, "critic/q_mean": q.mean(), "critic/target": target.mean()}
    return loss, (info, updates["batch_stats"])


def actor_loss(
    actor_params: Params, agent: CrossQ, batch: Batch, key: jax.Array
) -> tuple[jax.Array, tuple[InfoDict, Params]]:
    """SAC's policy objective ``E[alpha log pi(a|s) - min_j Q_j(s, a)]`` (SAC eq. 7).

    The actor normalizes with the batch's statistics, the critic with its running ones (as SBX).
    Returns the actor's new running statistics beside the info.
    """
    variables = with_stats(actor_params, agent.actor_stats)
    dist, updates = agent.actor.apply_fn(variables, batch.obs, True, mutable=["batch_stats"])
    actions, log_probs = dist.sample_and_log_prob(key)
    critic_vars = with_stats(agent.critic.params, agent.critic_stats)
    q = agent.critic.apply_fn(critic_vars, batch.obs, actions).min(axis=0)
    alpha = agent.temp.apply_fn(agent.temp.params)
    loss = jnp.mean(alpha * log_probs - q)
    info = {"actor/loss": loss, "actor/entropy": -log_probs.mean()}
    return loss, (info, updates["batch_stats"])


def log_temperature_loss(
    temp_params: Params, agent: CrossQ, entropy: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``log(alpha) (H(pi) - target_entropy)``: the temperature loss of SB3 and SBX.

    The gradient with respect to ``log(alpha)`` is SAC eq. 18's divided by alpha.
    """
    alpha = agent.temp.apply_fn(temp_params)
    loss = jnp.log(alpha) * (entropy - agent.hparams["target_entropy"])
    return loss, {"temp/loss": loss, "temp/alpha": alpha}


# -------------------------------------------------------------------------------------- the agent


class CrossQ(struct.PyTreeNode):
    """CrossQ state: networks, their running statistics, temperature, RNG, hyperparameters."""

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    temp: TrainState
    actor_stats: Params
    critic_stats: Params
    step: jax.Array
    hparams: dict[str, jax.Array]
    config: CrossQConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[CrossQ, InfoDict]:
        """A critic step; every ``policy_delay``-th call also an actor and a temperature step.

        The actor's info values are 0 on the calls without its step (the loops log the last
        call of a group; with ``utd_ratio`` a multiple of ``policy_delay`` that one steps it).
        """
        rng, k_next, k_actor = jax.random.split(self.rng, 3)
        actor_vars = with_stats(self.actor.params, self.actor_stats)
        dist = self.actor.apply_fn(actor_vars, batch.next_obs)
        next_actions, next_log_probs = dist.sample_and_log_prob(k_next)
        critic, info, stats = nets.stats_gradient_step(
            self.critic, critic_loss, self, batch, next_actions, next_log_probs
        )
        agent = self.replace(rng=rng, critic=critic, critic_stats=stats)

        def actor_step(agent: CrossQ) -> tuple[CrossQ, InfoDict]:
            actor, info, stats = nets.stats_gradient_step(
                agent.actor, actor_loss, agent, batch, k_actor
            )
            entropy = info["actor/entropy"]
            temp, temp_info = nets.gradient_step(agent.temp, log_temperature_loss, agent, entropy)
            return agent.replace(actor=actor, temp=temp, actor_stats=stats), {**info, **temp_info}

        due = (self.step + 1) % self.config.policy_delay == 0
        agent, actor_info = nets.when(due, actor_step, agent)
        return agent.replace(step=self.step + 1), {**info, **actor_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Stochastic actions in [-1, 1] for exploration (running statistics)."""
        variables = with_stats(self.actor.params, self.actor_stats)
        return self.actor.apply_fn(variables, obs).sample(rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions (tanh of the mean) in [-1, 1] (running statistics)."""
        variables = with_stats(self.actor.params, self.actor_stats)
        return self.actor.apply_fn(variables, obs).mode()

    @classmethod
    def create(
        cls, config: CrossQConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> CrossQ:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic, k_temp = jax.random.split(jax.random.key(seed), 4)
        action_dim = action_example.shape[-1]
        obs, act = obs_example[None], action_example[None]
        norm = {"momentum": config.bn_momentum, "warmup_steps": config.renorm_warmup_steps}
        make = partial(nets.make_stats_train_state, b1=config.adam_b1)
        actor_def = RenormActor(action_dim, config.actor_hidden_dims, **norm)
        actor, actor_stats = make(actor_def, k_actor, config.actor_lr, obs)
        critic_def = RenormCritic(config.critic_hidden_dims, config.num_qs, **norm)
        critic, critic_stats = make(critic_def, k_critic, config.critic_lr, obs, act)
        temp_def = nets.Temperature(config.init_temperature)
        temp = nets.make_train_state(temp_def, k_temp, config.temp_lr)
        target_entropy = config.target_entropy
        if target_entropy is None:
            target_entropy = -float(action_dim)
        hparams = {
            "discount": jnp.float32(config.discount),
            "target_entropy": jnp.float32(target_entropy),
        }
        step = jnp.zeros((), jnp.int32)
        return cls(rng, actor, critic, temp, actor_stats, critic_stats, step, hparams, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class CrossQConfig(OffPolicyFields):
    """CrossQ hyperparameters: SBX's ``CrossQ`` defaults (the paper's, with a narrower critic).

    Deviations, on purpose: the critic is 1024 wide as in SBX (the paper: 2048, pass
    ``--critic-hidden-dims 2048 2048``); 5,000 random warm-up steps as the paper's MuJoCo runs
    (SBX's default is 100); the log-std is bounded smoothly to [-5, 2] and the actor's two heads
    start Xavier-uniform, as jaxrl's SAC (SBX clips to [-20, 2]; LeCun-normal heads). There is no
    target network, so ``tau`` is unused.
    """

    learning_starts: int = 5_000

    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics."""
    temp_lr: float = 1e-3
    """Adam learning rate of the entropy temperature (Adam's default beta1)."""
    adam_b1: float = 0.5
    """Adam's beta1 of the actor and the critics (CrossQ: 0.5)."""
    actor_hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor."""
    critic_hidden_dims: tuple[int, ...] = (1024, 1024)
    """Hidden layer widths of each critic (SBX: 1024; the paper: 2048)."""
    num_qs: int = 2
    """Number of Q-functions; the target and the actor take their minimum."""
    policy_delay: int = 3
    """Critic steps per actor and temperature step."""
    bn_momentum: float = 0.99
    """Momentum of the batch-renormalization running statistics."""
    renorm_warmup_steps: int = 100_000
    """Training calls of each batch-renormalization layer that are plain batch normalization."""
    init_temperature: float = 1.0
    """Initial entropy temperature alpha."""
    target_entropy: float | None = None
    """Target policy entropy; None = -action_dim."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            "actor_lr",
            "critic_lr",
            "temp_lr",
            "actor_hidden_dims",
            "critic_hidden_dims",
            "num_qs",
            "policy_delay",
            "init_temperature",
        )
        check_range(self, "adam_b1", 0.0, 1.0)
        check_range(self, "bn_momentum", 0.0, 1.0)
        check_range(self, "renorm_warmup_steps", 0, float("inf"))
