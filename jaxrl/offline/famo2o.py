"""FamO2O on IQL (Wang et al., 2023, "Train Once, Get a Family", arXiv:2310.17966).

IQL's advantage-weighted regression fixes one inverse temperature ``beta`` for every state: how
far the policy may move from the data towards high advantages. FamO2O learns a family of policies
instead, a universal policy ``pi_u(a | s, beta)`` trained with each row's own ``beta``, and a
balance model ``pi_b(s) -> beta in [beta_min, beta_max]`` that picks the member for each state by
maximizing the critic's value of the universal policy's action (with a SAC-style entropy bonus).
The value and critics are IQL's (``jaxrl.offline.iql.value_and_critic_step``). One ``update``
follows the authors' ``family_learner._family_update_jit``: value, balance model, its entropy
temperature, universal policy (new ``V``, the balance model from before this update), critics
and the Polyak target update. The universal policy learns from ``beta`` drawn uniformly from
the range during the offline phase and from the balance model's samples during fine-tuning
(the authors' ``random_hierarchical_coefficients=(i < 1)``): the agent counts its updates and
switches after ``config.max_steps``, which the loops set to the run's offline budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.config import (
    ConfigError,
    OfflineFields,
    RewardNormalization,
    check_positive,
    check_range,
)
from jaxrl.distributions import TanhNormal
from jaxrl.offline.common import DataNorm
from jaxrl.offline.iql import value_and_critic_step
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def beta_encoding(beta: jax.Array, dim: int, base: float) -> jax.Array:
    """``[...] -> [..., dim]``: ``sin, cos`` of ``beta / base^(2i/dim)``, interleaved.

    The authors' ``family_utils.sin_cos_skill_func``: the universal policy reads ``beta`` through
    this transformer-style position encoding.
    """
    # numpy constants and concatenate: iota and stack in the policy would not export to ONNX
    freqs = np.float32(base) ** (-2.0 * np.arange(dim // 2, dtype=np.float32) / dim)
    x = beta[..., None] * freqs
    pairs = jnp.concatenate([jnp.sin(x)[..., None], jnp.cos(x)[..., None]], axis=-1)
    return pairs.reshape(*beta.shape, dim)


class BalanceModel(nn.Module):
    """``pi_b(u | s)``: a tanh-squashed Gaussian over ``u in (-1, 1)``, one state-independent std.

    As the authors' balance model (``NormalTanhPolicy(action_dim=1, state_dependent_std=False,
    tanh_squash_distribution=True)``, log-std initialized at 0 and clipped to [-10, 2]).
    """

    hidden_dims: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array) -> TanhNormal:
        """The distribution of ``u`` for ``obs``; ``beta`` is ``u`` mapped onto the range."""
        loc = nets.MLP((*self.hidden_dims, 1))(obs)
        log_std = self.param("log_std", nn.initializers.zeros, (1,))
        return TanhNormal(loc, jnp.broadcast_to(jnp.exp(jnp.clip(log_std, -10.0, 2.0)), loc.shape))


def to_beta(u: jax.Array, hparams: dict[str, jax.Array]) -> jax.Array:
    """``u in [-1, 1]`` mapped affinely onto ``[beta_min, beta_max]``."""
    low, high = hparams["beta_min"], hparams["beta_max"]
    return low + (u + 1.0) / 2.0 * (high - low)


def universal_policy(
    agent: FamO2O, params: Params, obs: jax.Array, beta: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(mean, std)`` of ``pi_u(. | s, beta)``: IQL's Gaussian actor on ``[s, enc(beta)]``."""
    cfg = agent.config
    enc = beta_encoding(beta, cfg.beta_encoding_dim, cfg.beta_encoding_base)
    return agent.actor.apply_fn(params, jnp.concatenate([obs, enc], axis=-1))


def universal_loss(
    actor_params: Params, agent: FamO2O, batch: Batch, target_q: jax.Array, beta: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """AWR of ``pi_u(a | s, beta)`` with each row's own ``beta``.

    ``-E[min(exp(beta (Q - V)), 100) log pi_u(a | s, beta)]``: FamO2O's universal-model objective
    on IQL, i.e. IQL eq. 7 with a per-row temperature (authors' ``family_actor.family_update``).
    """
    adv = target_q - agent.value.apply_fn(agent.value.params, batch.obs)
    chex.assert_equal_shape([adv, beta])
    weights = rl.awr_weights(adv, beta, agent.hparams["max_weight"])
    mean, std = universal_policy(agent, actor_params, batch.obs, beta)
    loss = -jnp.mean(weights * rl.gaussian_log_prob(batch.action, mean, std))
    return loss, {
        "actor/loss": loss,
        "actor/adv_mean": adv.mean(),
        "actor/weight_mean": weights.mean(),
        "actor/beta_mean": beta.mean(),
        "actor/std": std.mean(),
    }


def balance_loss(
    balance_params: Params, agent: FamO2O, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``E[alpha log pi_b(u|s) - min_i Q_target_i(s, a)]``, ``a ~ pi_u(. | s, beta(u))``.

    FamO2O's balance-model objective (maximize the value of the universal policy's action) with
    the entropy bonus of the authors' ``family_actor.family_hierarchical_update``. Both samples
    are reparameterized, so the gradient reaches ``pi_b`` through ``a``, the universal policy
    (not updated here) and ``beta``.
    """
    k_u, k_a = jax.random.split(key)
    u, log_prob = agent.balance.apply_fn(balance_params, batch.obs).sample_and_log_prob(k_u)
    beta = to_beta(jnp.squeeze(u, -1), agent.hparams)
    mean, std = universal_policy(agent, agent.actor.params, batch.obs, beta)
    action = mean + std * jax.random.normal(k_a, mean.shape)
    qs = agent.critic.apply_fn(agent.target_critic_params, batch.obs, action)
    q = rl.min_over_ensemble(qs)
    alpha = agent.temp.apply_fn(agent.temp.params)
    loss = jnp.mean(alpha * log_prob - q)
    return loss, {
        "balance/loss": loss,
        "balance/q": q.mean(),
        "balance/beta_mean": beta.mean(),
        "balance/beta_std": beta.std(),
        "balance/entropy": -log_prob.mean(),
    }


def temperature_loss(
    temp_params: Params, agent: FamO2O, entropy: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """The balance model's entropy temperature, SAC eq. 18: ``alpha (H(pi_b) - target)``."""
    alpha = agent.temp.apply_fn(temp_params)
    loss = alpha * (jax.lax.stop_gradient(entropy) - agent.hparams["target_entropy"])
    return loss, {"temp/loss": loss, "temp/alpha": alpha}


# -------------------------------------------------------------------------------------- the agent


class FamO2O(struct.PyTreeNode):
    """FamO2O state: universal policy, balance model and its temperature, IQL's value and critics.

    ``step`` counts updates; while it is below ``offline_updates`` (``config.max_steps``, carried
    into the online phase with the rest of the state) the universal policy learns from uniformly
    drawn ``beta``, afterwards from the balance model's. Sweepable leaves: the learning rates (in
    each ``opt_state``) and ``hparams`` (``discount``, ``tau``, ``expectile``, ``max_weight``,
    ``beta_min``, ``beta_max``, ``target_entropy``).
    """

    rng: jax.Array
    actor: TrainState
    balance: TrainState
    temp: TrainState
    value: TrainState
    critic: TrainState
    target_critic_params: Params
    hparams: dict[str, jax.Array]
    step: jax.Array
    offline_updates: jax.Array
    norm: DataNorm
    config: FamO2OConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[FamO2O, InfoDict]:
        """Balance model and temperature, IQL's value/critic/target step, then the universal policy.

        Equivalent to the authors' order (value, balance, temperature, actor, critic, target):
        the balance step reads no ``V`` and the actor reads the new ``V``, the target critics'
        values from before this update and the balance model from before its step.
        """
        batch = self.norm.batch(batch)
        rng, k_balance, k_sample, k_uniform = jax.random.split(self.rng, 4)
        u = self.balance.apply_fn(self.balance.params, batch.obs).sample(k_sample).squeeze(-1)
        uniform = jax.random.uniform(k_uniform, u.shape, minval=-1.0, maxval=1.0)
        online = self.step >= self.offline_updates
        beta = jax.lax.stop_gradient(to_beta(jnp.where(online, u, uniform), self.hparams))
        balance, info = nets.gradient_step(self.balance, balance_loss, self, batch, k_balance)
        temp, temp_info = nets.gradient_step(
            self.temp, temperature_loss, self, info["balance/entropy"]
        )
        agent = self.replace(rng=rng, balance=balance, temp=temp, step=self.step + 1)
        agent, target_q, critic_info = value_and_critic_step(agent, batch)
        actor, actor_info = nets.gradient_step(
            agent.actor, universal_loss, agent, batch, target_q, beta
        )
        return agent.replace(actor=actor), {**info, **temp_info, **critic_info, **actor_info}

    def coefficients(self, obs: jax.Array) -> jax.Array:
        """The balance model's deterministic ``beta`` (tanh of its mean, mapped) for raw ``obs``."""
        # squeeze, not [..., 0]: indexing with a symbolic batch traces to gather (no ONNX export)
        dist = self.balance.apply_fn(self.balance.params, self.norm.obs(obs))
        return to_beta(jnp.squeeze(dist.mode(), -1), self.hparams)

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """``pi_u`` sampled at the balance model's deterministic ``beta``, clipped to [-1, 1].

        As the authors' ``FamilyLearner.sample_actions``: exploration comes from the universal
        policy only.
        """
        mean, std = universal_policy(
            self, self.actor.params, self.norm.obs(obs), self.coefficients(obs)
        )
        return jnp.clip(mean + std * jax.random.normal(rng, mean.shape), -1.0, 1.0)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """The universal policy's mean at the balance model's deterministic ``beta``."""
        return universal_policy(
            self, self.actor.params, self.norm.obs(obs), self.coefficients(obs)
        )[0]

    @classmethod
    def create(
        cls, config: FamO2OConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> FamO2O:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_bal, k_temp, k_value, k_critic = jax.random.split(jax.random.key(seed), 6)
        obs, act = obs_example[None], action_example[None]
        obs_beta = jnp.concatenate([obs, jnp.zeros((1, config.beta_encoding_dim))], axis=-1)
        actor_def = nets.GaussianActor(action_example.shape[-1], config.hidden_dims)
        actor = nets.make_train_state(actor_def, k_actor, config.actor_lr, obs_beta)
        balance_def = BalanceModel(config.hidden_dims)
        balance = nets.make_train_state(balance_def, k_bal, config.balance_lr, obs)
        temp_def = nets.Temperature(config.init_temperature)
        temp = nets.make_train_state(temp_def, k_temp, config.temp_lr)
        value_def = nets.ValueNetwork(config.hidden_dims)
        value = nets.make_train_state(value_def, k_value, config.value_lr, obs)
        critic_def = nets.EnsembleQ(config.hidden_dims, config.num_qs)
        critic = nets.make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        target = jax.tree.map(jnp.copy, critic.params)  # distinct buffers, so both can be donated
        hparams = nets.hparam_leaves(
            config, "discount", "tau", "expectile", "max_weight", "beta_min", "beta_max",
            "target_entropy",
        )  # fmt: skip
        offline = 1_000_000 if config.max_steps is None else config.max_steps  # authors' budget
        return cls(
            rng, actor, balance, temp, value, critic, target, hparams, jnp.int32(0),
            jnp.int32(offline), DataNorm.identity(obs_example.shape[-1]), config,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class FamO2OConfig(OfflineFields):
    """FamO2O on IQL; defaults are IQL's MuJoCo settings with the authors' FamO2O additions.

    Deviations from the authors' code: the switch from uniform to the balance model's ``beta`` is
    an update count (``max_steps``) carried in the agent's state, not a flag of the training
    loop; the actor learning rate is constant (their fine-tuning configs turn IQL's cosine decay
    off: a decay over the offline phase would freeze the actor online); the balance model and
    the universal policy draw independent noise (the authors reuse one key); the balance model
    has its own learning rate (theirs is ``actor_lr``, the same default); observations are
    standardized (CORL; the authors do not). The authors ship only AntMaze settings (expectile
    0.9, beta in [8, 14]); the locomotion defaults here are IQL's expectile 0.7 and their
    learner's default range [1, 5], which holds IQL's beta = 3.
    """

    normalize_observations: bool = True  # CORL; the authors do not
    reward_normalization: RewardNormalization = "return_range"  # the authors'

    actor_lr: float = 3e-4
    """Adam learning rate of the universal policy pi_u(a | s, beta)."""
    balance_lr: float = 3e-4
    """Adam learning rate of the balance model pi_b(s) -> beta."""
    temp_lr: float = 3e-4
    """Adam learning rate of the balance model's entropy temperature."""
    value_lr: float = 3e-4
    """Adam learning rate of the value network V."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics."""
    max_steps: int | None = None
    """Updates with uniform beta for pi_u (offline), then pi_b's beta; None = the offline budget."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of every network."""
    num_qs: int = 2
    """Number of critics (V regresses onto their minimum)."""
    expectile: float = 0.7
    """Expectile tau of the value regression (0.5 = SARSA mean; -> 1 approaches the max)."""
    beta_min: float = 1.0
    """Lowest inverse temperature beta of the advantage weights the balance model may pick."""
    beta_max: float = 5.0
    """Highest inverse temperature beta the balance model may pick."""
    max_weight: float = 100.0
    """Upper clip of the advantage weights exp(beta * A)."""
    beta_encoding_dim: int = 6
    """Size of the sin/cos encoding of beta that the universal policy reads (even)."""
    beta_encoding_base: float = 10000.0
    """Base n of the encoding's frequencies n^(-2i/d)."""
    init_temperature: float = 1.0
    """Initial entropy temperature of the balance model."""
    target_entropy: float = -0.5
    """Entropy target of the balance model's temperature tuning."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self, "actor_lr", "balance_lr", "temp_lr", "value_lr", "critic_lr", "hidden_dims",
            "num_qs", "max_weight", "beta_encoding_base", "init_temperature",
        )  # fmt: skip
        if not 0.0 < self.expectile < 1.0:
            raise ConfigError(
                f"FamO2OConfig.expectile must be in (0, 1), got {self.expectile!r}; set "
                "--expectile to e.g. 0.7 (0.5 = mean; values near 1 approach the maximum)."
            )
        check_range(self, "beta_min", 0.0, float("inf"))
        check_range(self, "beta_max", 0.0, float("inf"))
        if not self.beta_min < self.beta_max:
            raise ConfigError(
                f"FamO2OConfig needs beta_min < beta_max, got [{self.beta_min}, {self.beta_max}]; "
                "set --beta-min and --beta-max to a range such as 1 and 5."
            )
        if self.beta_encoding_dim <= 0 or self.beta_encoding_dim % 2:
            raise ConfigError(
                "FamO2OConfig.beta_encoding_dim must be even and positive (sines and cosines), "
                f"got {self.beta_encoding_dim}; set --beta-encoding-dim to e.g. 6."
            )
        check_range(self, "target_entropy", float("-inf"), float("inf"))
        if self.max_steps is not None:
            check_range(self, "max_steps", 0, float("inf"))
