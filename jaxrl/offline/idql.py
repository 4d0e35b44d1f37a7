"""IDQL: Implicit Diffusion Q-Learning (Hansen-Estruch et al., 2023, arXiv:2304.10573).

IDQL keeps IQL's critic (an expectile value ``V`` and twin ``Q`` trained on dataset actions only)
and replaces the policy: a diffusion model clones the behavior policy, and at action time ``N``
candidates are drawn from it and the one with the highest ``Q`` is taken ("IDQL-Imp" with
argmax selection, as the authors' ``eval_actions``). The value, critic and target steps are IQL's
own (``iql.value_and_critic_step``). The sampler is IDQL's ``ddpm_sampler``: the iterate clipped
to [-1, 1] after every step, noise of variance ``beta_t`` (``gen.ddpm_sample``).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import generative as gen
from jaxrl import rl
from jaxrl.config import (
    ConfigError,
    OfflineFields,
    RewardNormalization,
    check_positive,
    check_range,
)
from jaxrl.networks import EnsembleQ, ValueNetwork, gradient_step, hparam_leaves, make_train_state
from jaxrl.offline import iql
from jaxrl.offline.common import (
    DataNorm,
    check_generative_config,
    map_rows,
    repeat_rows,
    select_by_value,
)
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def diffusion_bc_loss(
    actor_params: Params, agent: IDQL, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """DDPM noise-prediction loss ``E ||eps - eps_theta(s, x_t, t)||^2`` (Ho et al., 2020, eq. 14).

    IDQL's behavior-cloning objective (``actor_objective='bc'``, unweighted): summed over action
    dimensions, averaged over the batch, with the noise network's dropout active.
    """
    k_noise, k_drop = jax.random.split(key)
    fn = partial(
        agent.actor.apply_fn, actor_params, batch.obs, train=True, rngs={"dropout": k_drop}
    )
    loss = jnp.mean(gen.ddpm_loss(fn, k_noise, batch.action, agent.schedule))
    return loss, {"actor/loss": loss}


# -------------------------------------------------------------------------------------- the agent


class IDQL(struct.PyTreeNode):
    """IDQL state: diffusion actor (+ EMA), value, twin critics and targets, RNG, data norm.

    Sweepable leaves: the learning rates (in each ``opt_state``) and ``hparams`` (``discount``,
    ``tau``, ``expectile``, ``actor_ema_tau``).
    """

    rng: jax.Array
    actor: TrainState
    actor_ema_params: Params
    value: TrainState
    critic: TrainState
    target_critic_params: Params
    hparams: dict[str, jax.Array]
    norm: DataNorm
    action_dim: int = struct.field(pytree_node=False)
    config: IDQLConfig = struct.field(pytree_node=False)

    @property
    def schedule(self) -> gen.DiffusionSchedule:
        """The variance-preserving schedule of ``config.diffusion_steps`` steps."""
        return gen.vp_schedule(self.config.diffusion_steps)

    def update(self, batch: Batch) -> tuple[IDQL, InfoDict]:
        """IQL's value, critic and target steps, one diffusion BC step, the actor's average."""
        batch = self.norm.batch(batch)
        rng, key = jax.random.split(self.rng)
        agent, _, info = iql.value_and_critic_step(self, batch)
        actor, actor_info = gradient_step(agent.actor, diffusion_bc_loss, agent, batch, key)
        ema = rl.polyak_update(actor.params, self.actor_ema_params, self.hparams["actor_ema_tau"])
        agent = agent.replace(rng=rng, actor=actor, actor_ema_params=ema)
        return agent, {**info, **actor_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Best of ``num_samples`` fresh diffusion samples by ``min_i Q_target_i``."""
        obs = repeat_rows(self.norm.obs(obs), self.config.num_samples)
        fn = partial(self.actor.apply_fn, self.actor_ema_params, obs)
        actions = gen.ddpm_sample(fn, rng, (*obs.shape[:-1], self.action_dim), self.schedule)
        qs = self.critic.apply_fn(self.target_critic_params, obs, actions)
        return select_by_value(actions, jnp.min(qs, axis=0))

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """As ``sample_actions``, noise seeded by each observation: a deterministic policy."""
        return map_rows(self.sample_actions, self.rng, obs)

    @classmethod
    def create(
        cls, config: IDQLConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> IDQL:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_value, k_critic = jax.random.split(jax.random.key(seed), 4)
        obs, act = obs_example[None], action_example[None]
        actor_def = gen.DenoiserNet(
            action_example.shape[-1],
            config.actor_hidden_dims,
            config.actor_architecture,
            dropout_rate=config.actor_dropout,
            time_dim=config.time_dim,
        )
        actor, ema = gen.init_diffusion_actor(
            actor_def, k_actor, config.actor_lr, obs, act, config.max_steps
        )
        value = make_train_state(ValueNetwork(config.hidden_dims), k_value, config.value_lr, obs)
        critic_def = EnsembleQ(config.hidden_dims, config.num_qs)
        critic = make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        hparams = hparam_leaves(config, "discount", "tau", "expectile", "actor_ema_tau")
        target = jax.tree.map(jnp.copy, critic.params)
        norm, dim = DataNorm.identity(obs_example.shape[-1]), action_example.shape[-1]
        return cls(rng, actor, ema, value, critic, target, hparams, norm, dim, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class IDQLConfig(OfflineFields):
    """IDQL hyperparameters; defaults are the authors' D4RL locomotion launcher.

    From philippe-eecs/IDQL ``train_ddpm_iql_offline.py``: LN-ResNet noise network (3 blocks of
    256, dropout 0.1), T = 5 VP steps, N = 64 candidates, actor EMA 0.001, batch 512, expectile
    0.7, returns normalized by the dataset's return range.
    """

    batch_size: int = 512
    reward_normalization: RewardNormalization = "return_range"  # the authors'

    actor_lr: float = 3e-4
    """Adam learning rate of the diffusion actor (before the cosine decay)."""
    value_lr: float = 3e-4
    """Adam learning rate of the value network V."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics."""
    max_steps: int | None = None
    """Horizon of the actor's cosine decay; None = the run's --total-steps (1M outside a run);
    0 = no decay."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the value and critics."""
    actor_architecture: Literal["ln_resnet", "mlp"] = "ln_resnet"
    """Noise network: 'ln_resnet' (LayerNorm residual blocks, the authors') or a plain 'mlp'."""
    actor_hidden_dims: tuple[int, ...] = (256, 256, 256)
    """Noise network widths: one residual block per entry ('ln_resnet') or the MLP's layers."""
    actor_dropout: float = 0.1
    """Dropout rate inside the residual blocks during training."""
    time_dim: int = 16
    """Width of the sinusoidal diffusion-step embedding."""
    diffusion_steps: int = 5
    """Diffusion steps T of the variance-preserving schedule (training and sampling)."""
    num_samples: int = 64
    """Candidates N drawn per observation at action time; the best by Q is taken."""
    actor_ema_tau: float = 0.001
    """Step of the actor's moving average (the sampling weights): ema += tau * (params - ema)."""
    num_qs: int = 2
    """Number of critics (V regresses onto their minimum)."""
    expectile: float = 0.7
    """Expectile of the value regression (0.7 for locomotion, 0.9 for antmaze in the paper)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            *("actor_lr", "value_lr", "critic_lr", "hidden_dims", "actor_hidden_dims"),
            *("time_dim", "diffusion_steps", "num_samples", "num_qs"),
        )
        check_generative_config(self)
        if self.max_steps is not None:
            check_range(self, "max_steps", 0, float("inf"))
        if not 0.0 < self.expectile < 1.0:
            raise ConfigError(
                f"IDQLConfig.expectile must be in (0, 1), got {self.expectile!r}; set --expectile "
                "to e.g. 0.7 (0.5 = mean; values near 1 approach the maximum)."
            )
        check_range(self, "actor_dropout", 0.0, 1.0)
