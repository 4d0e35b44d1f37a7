"""H2O (Niu et al., NeurIPS 2022, arXiv:2206.13464): dynamics-aware hybrid offline-and-online RL.

"When to Trust Your Simulator": SAC trained on a mixed minibatch of real data (``--dataset``) and
simulator rollouts (the env it acts in). Two classifiers tell real transitions from simulated ones;
their outputs estimate the dynamics ratio ``P_real(s'|s,a) / P_sim(s'|s,a)``, which

- weighs each simulated row's Bellman error (``w``, clipped to ``[1e-5, 1]``), and
- picks the simulated ``(s, a)`` pairs a conservative penalty pushes down (``omega``, large where
  the simulator's next states are unlikely under the real dynamics), while the real data's Q-values
  are pushed up.

The ratio is only as good as the discriminators: when the real data's ``(s, a)`` are easy to
tell from the simulator's (rollouts of one policy against the learner's), ``d_sa`` saturates and
``d_sas`` also separates by ``(s, a)``, which down-weights simulated rows even where the dynamics
agree. Broad real data (the paper's D4RL medium-replay; random rollouts in the learning test)
avoid it.

Every minibatch row carries ``from_dataset`` (1 real, 0 simulated; the registry's
``needs_source``). Without real rows (no ``--dataset``) ``w = 1`` and the penalty is 0: the agent
is SAC without the entropy term in the target, on simulator data only.

Deviations from the authors' code (t6-thu/H2O, ``SimpleSAC/sim2real_sac.py``):

- The discriminators train on the critic's minibatch (``--offline-ratio`` real rows, 0.5 by
  default); the authors draw a separate batch of 256 real and 256 simulated rows for them.
- The noise added to the simulated next states when ``u`` is estimated has the per-feature
  standard deviation of the minibatch's next observations (real and simulated rows together);
  the authors use the standard deviation of the states in their buffer's arrays when it is
  built (the real data and 10 times as many zero rows reserved for simulated ones).
- The temperature loss is SAC's ``alpha * (H - target)`` of ``jaxrl.agents.sac`` (the authors
  differentiate ``log_alpha * (H - target)``).
- Observations are not normalized (the authors use raw states too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import ClassVar

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.agents import sac
from jaxrl.config import OffPolicyFields, check_positive, check_range
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


class Discriminators(nn.Module):
    """The classifiers ``d_sa(s, a)`` and ``d_sas(s, a, s')``: MLPs, 2 logits through ``2 tanh``.

    Class 0 is real, class 1 simulated; ``softmax(d_sa)`` and ``softmax(d_sas + d_sa)`` are the
    probabilities of the source given ``(s, a)`` and given ``(s, a, s')``.
    """

    hidden_dims: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(
        self, obs: jax.Array, action: jax.Array, next_obs: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``(d_sa, d_sas)``, each ``[..., 2]`` in ``[-2, 2]``."""
        sa = jnp.concatenate([obs, action], axis=-1)
        d_sa = nets.MLP((*self.hidden_dims, 2))(sa)
        d_sas = nets.MLP((*self.hidden_dims, 2))(jnp.concatenate([sa, next_obs], axis=-1))
        return 2.0 * jnp.tanh(d_sa), 2.0 * jnp.tanh(d_sas)


def dynamics_log_ratio(d_sa: jax.Array, d_sas: jax.Array) -> jax.Array:
    """``log P_real(s'|s,a) - log P_sim(s'|s,a)`` from the two classifiers, by Bayes' rule.

    H2O's dynamics-ratio estimate: ``p(real|s,a,s') / p(sim|s,a,s')`` divided by
    ``p(real|s,a) / p(sim|s,a)``, with ``p(.|s,a,s') = softmax(d_sas + d_sa)`` and
    ``p(.|s,a) = softmax(d_sa)`` (class 0 real), as in the authors' code. The ``d_sa`` terms
    cancel: the estimate is ``d_sas[0] - d_sas[1]``, within ``[-4, 4]`` by the ``2 tanh``
    outputs, so ``w >= exp(-4)`` and ``u <= 4`` (the ``w_min`` and ``u_max`` clips do not bind
    at their defaults, in the authors' code either).

    Args:
        d_sa: ``[..., 2]`` outputs of ``d_sa``.
        d_sas: ``[..., 2]`` outputs of ``d_sas``.

    Returns:
        ``[...]`` log-ratios.
    """
    chex.assert_equal_shape([d_sa, d_sas])
    log_sa = jax.nn.log_softmax(d_sa, axis=-1)
    log_sas = jax.nn.log_softmax(d_sas + d_sa, axis=-1)
    return log_sas[..., 0] - log_sas[..., 1] - log_sa[..., 0] + log_sa[..., 1]


def bellman_weights(log_ratio: jax.Array, w_min: float | jax.Array) -> jax.Array:
    """H2O's weights of the simulated Bellman errors, ``clip(exp(log_ratio), w_min, 1)``."""
    return jnp.clip(jnp.exp(log_ratio), w_min, 1.0)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x [..., B]`` over the rows where ``mask [B]`` is 1; 0 when there are none."""
    chex.assert_rank(mask, 1)
    return jnp.sum(x * mask, axis=-1) / jnp.maximum(jnp.sum(mask), 1.0)


def penalty_weights(u: jax.Array, sim: jax.Array) -> jax.Array:
    """``omega = u / sum_sim u`` over the simulated rows (0 on real rows), ``[B]``.

    Uniform over the simulated rows when every ``u`` there is 0 (no simulated transition looks
    less likely under the real dynamics), so the weights always sum to 1 when any row is simulated.
    """
    chex.assert_equal_shape([u, sim])
    u = u * sim
    total = jnp.sum(u)
    uniform = sim / jnp.maximum(jnp.sum(sim), 1.0)
    return jnp.where(total > 0, u / jnp.where(total > 0, total, 1.0), uniform)


def conservative_gap(qs: jax.Array, omega: jax.Array, real: jax.Array) -> jax.Array:
    """Per critic ``logsumexp_sim(Q(s, a) + log omega) - mean_real Q(s, a)``, ``[num_qs]``.

    H2O's dynamics-aware CQL term: a soft maximum of the Q-values of the simulated rows (with
    their stored actions), weighted by ``omega``, minus the mean Q-value of the real rows.
    ``omega`` must be 0 on real rows and sum to 1 (``penalty_weights``).
    """
    chex.assert_rank([qs, omega, real], [2, 1, 1])
    soft_max = jax.nn.logsumexp(qs, axis=-1, b=jnp.where(omega > 0, omega, 0.0)[None])
    return soft_max - masked_mean(qs, real)


def sources(batch: Batch) -> tuple[jax.Array, jax.Array]:
    """``(real, sim)`` row masks ``[B]``; a batch without ``from_dataset`` is all simulated."""
    if batch.from_dataset is None:
        return jnp.zeros_like(batch.reward), jnp.ones_like(batch.reward)
    real = batch.from_dataset.astype(batch.reward.dtype)
    return real, 1.0 - real


def discriminator_loss(
    params: Params, agent: H2O, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Cross-entropy of both classifiers on noisy inputs (real = class 0, simulated = class 1).

    H2O's discriminator objective, as the authors' code: ``N(0, disc_noise_std^2)`` noise on
    ``s``, ``a`` and ``s'``; ``d_sas``'s loss also reaches ``d_sa`` (its logits are
    ``d_sas + d_sa``), so ``d_sa`` trains on the sum of both losses. 0 unless the batch holds
    both real and simulated rows.
    """
    real, sim = sources(batch)
    std, keys = agent.hparams["disc_noise_std"], jax.random.split(key, 3)
    inputs = (batch.obs, batch.action, batch.next_obs)
    noisy = [x + std * jax.random.normal(k, x.shape) for k, x in zip(keys, inputs, strict=True)]
    d_sa, d_sas = agent.disc.apply_fn(params, *noisy)
    labels = sim.astype(jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels
    loss_sa, loss_sas = ce(d_sa, labels).mean(), ce(d_sas + d_sa, labels).mean()
    both = (jnp.sum(real) > 0) & (jnp.sum(sim) > 0)
    loss = jnp.where(both, loss_sa + loss_sas, 0.0)
    acc_sas = jnp.mean(jnp.argmax(d_sas + d_sa, axis=-1) == labels)
    return loss, {"disc/loss": loss, "disc/loss_sa": loss_sa, "disc/accuracy": acc_sas}


def dynamics_weights(
    agent: H2O, batch: Batch, key: jax.Array
) -> tuple[jax.Array, jax.Array, InfoDict]:
    """``(w [B], omega [B], info)`` from the discriminators, without gradient.

    ``w = bellman_weights(log_ratio(s, a, s'))`` weighs the simulated Bellman errors (1 on every
    row when the batch has no real rows: nothing tells the simulator's dynamics from the real).
    ``u = clip(mean_k log(P_sim/P_real)(s~_k|s, a), 1e-45, u_max)`` over ``num_next_samples``
    draws ``s~ = s' + N(0, std(s')^2)``, and ``omega = penalty_weights(u)``.
    """
    real, sim = sources(batch)
    apply = partial(agent.disc.apply_fn, agent.disc.params)
    log_ratio = dynamics_log_ratio(*apply(batch.obs, batch.action, batch.next_obs))
    w = jnp.where(jnp.sum(real) > 0, bellman_weights(log_ratio, agent.hparams["w_min"]), 1.0)
    n, std = agent.config.num_next_samples, jnp.std(batch.next_obs, axis=0)
    noise = std * jax.random.normal(key, (n, *batch.next_obs.shape))
    obs, act = (jnp.broadcast_to(x, (n, *x.shape)) for x in (batch.obs, batch.action))
    u = -dynamics_log_ratio(*apply(obs, act, batch.next_obs + noise)).mean(axis=0)
    u = jnp.clip(u, 1e-45, agent.hparams["u_max"])
    omega = penalty_weights(u, sim)
    info = {
        "h2o/w_sim": masked_mean(w, sim),
        "h2o/log_ratio_real": masked_mean(log_ratio, real),
        "h2o/log_ratio_sim": masked_mean(log_ratio, sim),
        "h2o/u_sim": masked_mean(u, sim),
    }
    return jax.lax.stop_gradient(w), jax.lax.stop_gradient(omega), info


def critic_loss(
    critic_params: Params,
    agent: H2O,
    batch: Batch,
    key: jax.Array,
    w: jax.Array,
    omega: jax.Array,
) -> tuple[jax.Array, InfoDict]:
    """H2O's critic objective, summed over the critics.

    Per critic: ``mean_real (Q - y)^2 + mean_sim w (Q - y)^2 + beta clip(gap, -1000, 1000)``
    with SAC's target ``y`` (``backup_entropy`` off by default), ``beta = cql_min_q_weight`` and
    the ``conservative_gap``; the penalty is 0 unless the batch holds real and simulated rows.
    """
    real, sim = sources(batch)
    target = sac.soft_td_target(agent, batch, key)
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    chex.assert_rank(qs, 2)
    sq = (qs - target[None]) ** 2
    real_td, sim_td = masked_mean(sq, real), masked_mean(w * sq, sim)
    both = (jnp.sum(real) > 0) & (jnp.sum(sim) > 0)
    gap = jnp.where(both, jnp.clip(conservative_gap(qs, omega, real), -1000.0, 1000.0), 0.0)
    penalty = agent.hparams["cql_min_q_weight"] * gap
    loss = jnp.sum(real_td + sim_td + penalty)
    return loss, {
        "critic/loss": loss,
        "critic/real_td": real_td.mean(),
        "critic/sim_td": sim_td.mean(),
        "critic/q_mean": qs.mean(),
        "critic/target": target.mean(),
        "h2o/gap": gap.mean(),
        "h2o/penalty": penalty.sum(),
    }


# -------------------------------------------------------------------------------------- the agent


class H2O(struct.PyTreeNode):
    """H2O state: SAC's networks and temperature, the two discriminators, RNG, hyperparameters."""

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    target_critic_params: Params
    temp: TrainState
    disc: TrainState
    hparams: dict[str, jax.Array]
    config: H2OConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[H2O, InfoDict]:
        """One step in the authors' order.

        The discriminators step first; then the temperature, actor and critic losses (with
        ``w`` and ``omega`` from the new discriminators) are all taken at the current
        parameters, the three step, and the target critics follow by Polyak averaging.
        """
        rng, k_disc, k_weights, k_critic, k_actor = jax.random.split(self.rng, 5)
        disc, disc_info = nets.gradient_step(self.disc, discriminator_loss, self, batch, k_disc)
        agent = self.replace(rng=rng, disc=disc)
        w, omega, weight_info = dynamics_weights(agent, batch, k_weights)
        actor, actor_info = nets.gradient_step(agent.actor, sac.actor_loss, agent, batch, k_actor)
        entropy = actor_info["actor/entropy"]
        temp, temp_info = nets.gradient_step(agent.temp, sac.temperature_loss, agent, entropy)
        critic, critic_info = nets.gradient_step(
            agent.critic, critic_loss, agent, batch, k_critic, w, omega
        )
        target = rl.polyak_update(critic.params, agent.target_critic_params, agent.hparams["tau"])
        agent = agent.replace(actor=actor, critic=critic, temp=temp, target_critic_params=target)
        return agent, {**disc_info, **weight_info, **actor_info, **temp_info, **critic_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Stochastic actions in [-1, 1] for exploration."""
        return self.actor.apply_fn(self.actor.params, obs).sample(rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions (tanh of the mean) in [-1, 1]."""
        return self.actor.apply_fn(self.actor.params, obs).mode()

    @classmethod
    def create(
        cls, config: H2OConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> H2O:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic, k_temp, k_disc = jax.random.split(jax.random.key(seed), 5)
        actor, critic, target, temp, hparams = sac.init_networks(
            config, obs_example, action_example, k_actor, k_critic, k_temp
        )
        obs, act = obs_example[None], action_example[None]
        disc = nets.make_train_state(
            Discriminators(config.disc_hidden_dims), k_disc, config.disc_lr, obs, act, obs
        )
        hparams |= nets.hparam_leaves(
            config, "cql_min_q_weight", "disc_noise_std", "w_min", "u_max"
        )
        return cls(rng, actor, critic, target, temp, disc, hparams, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class H2OConfig(OffPolicyFields):
    """H2O hyperparameters, from the authors' code (t6-thu/H2O, ``SimpleSAC``).

    Learning rates 3e-4, 256-256 networks, two critics, tau 5e-3, gamma 0.99, no entropy in the
    target, alpha from 1 with target entropy ``-|A|``, one gradient step per env step (one env);
    ``--offline-ratio 0.5`` gives their 128 real and 128 simulated rows of a 256-row batch.
    """

    # Static fields SAC's losses read: the plain clipped double-Q, the actor on its minimum.
    num_min_qs: ClassVar[None] = None
    policy_q: ClassVar[str] = "min"

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    temp_lr: float = 3e-4
    """Adam learning rate of the entropy temperature."""
    disc_lr: float = 3e-4
    """Adam learning rate of the two discriminators."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    disc_hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of each discriminator."""
    num_qs: int = 2
    """Number of Q-functions; targets and the actor use their minimum."""
    critic_layer_norm: bool = False
    """LayerNorm in the critics' hidden layers."""
    init_temperature: float = 1.0
    """Initial entropy temperature alpha."""
    target_entropy: float | None = None
    """Target policy entropy; None = -action_dim."""
    backup_entropy: bool = False
    """Include the entropy bonus in the TD target (the authors' code leaves it out)."""
    cql_min_q_weight: float = 0.01
    """Weight beta of the dynamics-aware conservative penalty (fixed, no Lagrange)."""
    disc_noise_std: float = 0.1
    """Std of the Gaussian noise on s, a and s' of the discriminators' training inputs."""
    w_min: float = 1e-5
    """Lower clip of the simulated rows' Bellman weights exp(log_ratio) (upper: 1)."""
    u_max: float = 10.0
    """Upper clip of u, the mean log(P_sim/P_real) of a simulated (s, a) (lower: 1e-45)."""
    num_next_samples: int = 10
    """Noisy next states s' + N(0, std^2) per simulated row when u is estimated."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self, "actor_lr", "critic_lr", "temp_lr", "disc_lr", "hidden_dims", "disc_hidden_dims"
        )
        check_positive(self, "num_qs", "init_temperature", "u_max", "num_next_samples")
        check_range(self, "cql_min_q_weight", 0.0, float("inf"))
        check_range(self, "disc_noise_std", 0.0, float("inf"))
        check_range(self, "w_min", 0.0, 1.0)
