"""A2PR: Adaptive Advantage-Guided Policy Regularization (Liu et al., ICML 2024, arXiv:2405.19909).

TD3+BC whose behavior-cloning target is chosen per state by an advantage estimate: a VAE trained
only on the dataset actions with positive advantage (the paper's "elevating positive behavior
learning", EPBL) proposes an action, and the actor is pulled toward whichever of that proposal and
the dataset action has the higher advantage ``A = Q_1(s, a) - V(s)``, and only where one of them is
not worse than ``V``. ``V`` regresses onto the smaller of two TD targets (online and target
critics). The update order and every constant follow the authors' ``A2PR.py`` (ltlhuuu/A2PR).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.agents import td3
from jaxrl.config import OfflineFields, check_positive, check_range
from jaxrl.offline.common import DataNorm
from jaxrl.types import Batch, InfoDict, Params


class VAE(nn.Module):
    """Conditional VAE ``q(z | s, a)``, ``p(a | s, z)`` over actions in [-1, 1] (as BCQ's).

    ``__call__(obs, action, key)`` returns the reconstruction ``tanh(dec(s, z))`` of a latent
    sampled by reparameterization, and the encoder's mean and log-std (clipped to [-4, 15]).
    """

    action_dim: int
    latent_dim: int
    hidden_dims: Sequence[int] = (750, 750)

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, key: jax.Array):
        """``(reconstruction, mean, log_std)`` for each (obs, action) row."""
        enc = nets.MLP((*self.hidden_dims, 2 * self.latent_dim), name="encoder")
        mean, log_std = jnp.split(enc(jnp.concatenate([obs, action], -1)), 2, axis=-1)
        log_std = jnp.clip(log_std, -4.0, 15.0)
        z = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        dec = nets.MLP((*self.hidden_dims, self.action_dim), name="decoder")
        return jnp.tanh(dec(jnp.concatenate([obs, z], -1))), mean, log_std


# ----------------------------------------------------------------------------------------- losses


def regularization_target(
    data_action: jax.Array, vae_action: jax.Array, q_data: jax.Array, q_vae: jax.Array, v: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The actor's per-row BC target and weight (A2PR, sec. 4: advantage-guided regularization).

    With ``A(a) = Q(s, a) - V(s)``: the target is the VAE's action where ``A(a_vae) >= A(a_data)``
    (ties: the VAE's), else the dataset action; the weight is 1 where ``Q(s, a_vae) >= V(s)`` or
    ``Q(s, a_data) > V(s)``, else 0 (the reference's exact comparisons).

    Args:
        data_action: ``[B, act_dim]`` dataset actions.
        vae_action: ``[B, act_dim]`` the VAE's actions.
        q_data: ``[B]`` ``Q(s, a_data)``.
        q_vae: ``[B]`` ``Q(s, a_vae)``.
        v: ``[B]`` ``V(s)``.

    Returns:
        ``[B, act_dim]`` targets and ``[B]`` weights in {0, 1}.
    """
    chex.assert_rank([data_action, vae_action, q_data, q_vae, v], [2, 2, 1, 1, 1])
    use_vae = (q_vae - v) >= (q_data - v)
    target = jnp.where(use_vae[:, None], vae_action, data_action)
    weight = ((q_vae >= v) | (q_data > v)).astype(jnp.float32)
    return target, weight


def value_loss(
    value_params: Params, agent: A2PR, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``E[(V(s) - min(y_online, y_target))^2]``: A2PR's state value for the advantage (sec. 4).

    Both targets bootstrap from the critic step's smoothed next action ``a'`` (the same ``key``):
    ``y = r + gamma (1 - d) min_i Q_i(s', a')`` with the just-updated critics and with the target
    critics; ``V`` regresses onto the smaller (reference lines 136-142).
    """
    next_actions, next_target_q = td3.target_values(agent, batch.next_obs, key)
    next_q = rl.min_over_ensemble(
        agent.critic.apply_fn(agent.critic.params, batch.next_obs, next_actions)
    )
    target = rl.td_target(
        batch.reward, batch.terminal, jnp.minimum(next_q, next_target_q), agent.hparams["discount"]
    )
    v = agent.value.apply_fn(value_params, batch.obs)
    loss = jnp.mean((v - jax.lax.stop_gradient(target)) ** 2)
    return loss, {"value/loss": loss, "value/v": v.mean()}


def vae_loss(
    vae_params: Params, agent: A2PR, batch: Batch, v: jax.Array, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """EPBL's ELBO (A2PR, sec. 4): reconstruction of positive-advantage actions plus a KL term.

    ``E[w * mean_j (a_hat_j - a_j)^2] + beta_KL * KL(q(z|s,a) || N(0, I))`` with
    ``w = vae_weight * 1[Q_1(s, a) > V(s)]``, ``Q_1`` the first (updated) critic, ``V`` the value
    before this update's value step, both reduced by means (reference lines 148-156).
    """
    recon, mean, log_std = agent.vae.apply_fn(vae_params, batch.obs, batch.action, key)
    q1 = agent.critic.apply_fn(agent.critic.params, batch.obs, batch.action)[0]
    positive = (q1 > v).astype(jnp.float32)
    w = agent.hparams["vae_weight"] * positive
    recon_loss = jnp.mean(w[:, None] * (recon - batch.action) ** 2)
    kl = -0.5 * jnp.mean(1.0 + 2.0 * log_std - mean**2 - jnp.exp(2.0 * log_std))
    loss = recon_loss + agent.hparams["vae_kl_weight"] * kl
    return loss, {
        "vae/loss": loss,
        "vae/recon": recon_loss,
        "vae/kl": kl,
        "vae/positive": positive.mean(),
    }


def actor_loss(
    actor_params: Params, agent: A2PR, batch: Batch, v: jax.Array, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``-lambda E[Q_1(s, pi(s))] + bc_coef E[w * mean_j (pi(s)_j - target_j)^2]`` (A2PR, sec. 4).

    ``lambda = alpha / E|Q_1(s, pi(s))|`` as TD3+BC (not differentiated). The VAE's proposal is
    its reconstruction of the policy's own action, ``a_vae = VAE(s, pi(s))``; ``target`` and ``w``
    are ``regularization_target(a, a_vae, Q_1(s, a), Q_1(s, a_vae), V(s))``. As in the reference
    (lines 169-185) the target is not detached: the BC term also differentiates through the
    (frozen) VAE's reconstruction of ``pi(s)``.
    """
    actions = agent.actor.apply_fn(actor_params, batch.obs)
    q = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)[0]
    lam = agent.hparams["alpha"] / jax.lax.stop_gradient(jnp.abs(q).mean())
    vae_actions, _, _ = agent.vae.apply_fn(agent.vae.params, batch.obs, actions, key)
    q_data = agent.critic.apply_fn(agent.critic.params, batch.obs, batch.action)[0]
    q_vae = agent.critic.apply_fn(agent.critic.params, batch.obs, vae_actions)[0]
    target, weight = regularization_target(
        batch.action, vae_actions, q_data, jax.lax.stop_gradient(q_vae), v
    )
    bc = jnp.mean(weight[:, None] * (actions - target) ** 2)
    loss = -lam * q.mean() + agent.hparams["bc_coef"] * bc
    info = (loss, bc, q.mean(), lam, weight.mean(), jnp.mean((q_vae - v) >= (q_data - v)))
    return loss, dict(zip(_ACTOR_INFO, info, strict=True))


# -------------------------------------------------------------------------------------- the agent


class A2PR(struct.PyTreeNode):
    """A2PR state: actor, twin critics, value, VAE, TD3 targets, step, RNG, hparams, data norm."""

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    value: TrainState
    vae: TrainState
    target_actor_params: Params
    target_critic_params: Params
    step: jax.Array
    hparams: dict[str, jax.Array]
    norm: DataNorm
    config: A2PRConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[A2PR, InfoDict]:
        """Critic, value and VAE steps every call; actor and targets every ``policy_delay`` calls.

        The reference's order: TD3's critic step (``td3.critic_loss``), the value step on the
        updated critics, the VAE step, then (delayed) the actor step on the updated critics and
        VAE and the Polyak update of both targets. ``V(s)`` in the VAE and actor losses is the
        value network's before this call's value step, as the reference computes it.
        """
        batch = self.norm.batch(batch)
        rng, k_vae, k_actor = jax.random.split(self.rng, 3)
        v = jax.lax.stop_gradient(self.value.apply_fn(self.value.params, batch.obs))

        def value_and_vae(agent: A2PR, batch: Batch, key: jax.Array) -> tuple[A2PR, InfoDict]:
            value, info = nets.gradient_step(agent.value, value_loss, agent, batch, key)
            vae, vae_info = nets.gradient_step(agent.vae, vae_loss, agent, batch, v, k_vae)
            return agent.replace(value=value, vae=vae), {**info, **vae_info}

        def actor(params: Params, agent: A2PR, batch: Batch) -> tuple[jax.Array, InfoDict]:
            return actor_loss(params, agent, batch, v, k_actor)

        return td3.delayed_policy_update(
            self.replace(rng=rng), batch, td3.critic_loss, actor, _ACTOR_INFO, value_and_vae
        )

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Deterministic action plus Gaussian exploration noise, clipped to [-1, 1]."""
        noise = self.hparams["exploration_noise"]
        return td3.exploration_actions(self.eval_actions(obs), noise, rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions in [-1, 1] for raw (unnormalized) observations."""
        return self.actor.apply_fn(self.actor.params, self.norm.obs(obs))

    @classmethod
    def create(
        cls,
        config: A2PRConfig,
        obs_example: jax.Array,
        action_example: jax.Array,
        seed: int | jax.Array,
    ) -> A2PR:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic, k_value, k_vae = jax.random.split(jax.random.key(seed), 5)
        obs, act = obs_example[None], action_example[None]
        act_dim = action_example.shape[-1]
        actor_def = nets.DeterministicActor(act_dim, config.actor_hidden_dims)
        actor = nets.make_train_state(actor_def, k_actor, config.actor_lr, obs)
        critic_def = nets.EnsembleQ(config.critic_hidden_dims, config.num_qs)
        critic = nets.make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        value_def = nets.ValueNetwork(config.critic_hidden_dims)
        value = nets.make_train_state(value_def, k_value, config.value_lr, obs)
        latent = config.vae_latent_dim or 2 * act_dim
        vae_def = VAE(act_dim, latent, config.vae_hidden_dims)
        vae = nets.make_train_state(vae_def, k_vae, config.vae_lr, obs, act, jax.random.key(0))
        hparams = nets.hparam_leaves(config, *_HPARAMS)
        # Targets start as copies (distinct buffers, so the whole agent can be donated to jit).
        target_actor, target_critic = jax.tree.map(jnp.copy, (actor.params, critic.params))
        norm = DataNorm.identity(obs_example.shape[-1])
        return cls(
            rng, actor, critic, value, vae, target_actor, target_critic, jnp.int32(0), hparams,
            norm, config,
        )  # fmt: skip


# Sweepable float leaves of ``hparams`` (copied from the config in ``create``).
_HPARAMS = ("discount", "tau", "alpha", "bc_coef", "vae_weight", "vae_kl_weight")
_HPARAMS += ("policy_noise", "noise_clip", "exploration_noise")
_ACTOR_INFO = ("actor/loss", "actor/bc", "actor/q", "actor/lambda", "actor/bc_weight")
_ACTOR_INFO += ("actor/vae_target",)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class A2PRConfig(OfflineFields):
    """A2PR hyperparameters; defaults are the authors' (ltlhuuu/A2PR ``utils/config.py``).

    The networks are the reference's: an actor of three hidden layers of 256, critics and value
    of four, a VAE with two hidden layers of 750 and a latent of twice the action dimension.
    ``alpha``, ``bc_coef`` and ``vae_weight`` are tuned per dataset by the authors (README:
    halfcheetah-medium alpha 40, bc_coef 1.0; hopper-medium bc_coef 0.4, discount 0.995;
    walker2d-medium bc_coef 1.0, vae_weight 1.5); the defaults are their command-line defaults.

    Deviations: the Dense layers use jaxrl's Xavier-uniform kernels and zero biases (the
    reference: PyTorch's default initialization), as TD3+BC here; the VAE's encoder emits mean
    and log-std from one Dense layer (the reference: two heads, the same function class); the
    reference's VAE decoder path with a latent clipped to [-0.5, 0.5] is never used by A2PR's
    training or acting, so it is not implemented; its ``normalize`` (observation standardization)
    is ``normalize_observations`` and uses the dataset statistics of ``DataNorm``.
    """

    normalize_observations: bool = True  # the reference's --normalize

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics."""
    value_lr: float = 3e-4
    """Adam learning rate of the value network V."""
    vae_lr: float = 1e-3
    """Adam learning rate of the VAE (PyTorch Adam's default in the reference)."""
    num_qs: int = 2
    """Number of critics (the TD targets take their minimum; actor and advantage use the first)."""
    actor_hidden_dims: tuple[int, ...] = (256, 256, 256)
    """Hidden layer widths of the actor."""
    critic_hidden_dims: tuple[int, ...] = (256, 256, 256, 256)
    """Hidden layer widths of each critic and of the value network."""
    vae_hidden_dims: tuple[int, ...] = (750, 750)
    """Hidden layer widths of the VAE's encoder and of its decoder."""
    vae_latent_dim: int = 0
    """Latent dimension of the VAE (0: twice the action dimension, the reference's)."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise (in normalized action units)."""
    noise_clip: float = 0.5
    """Clip range of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic/value/VAE updates per actor/target update."""
    alpha: float = 2.5
    """Weight of the Q term in the actor loss, lambda = alpha / mean|Q_1| (as TD3+BC)."""
    bc_coef: float = 0.5
    """Weight of the advantage-guided BC term of the actor loss (the reference's --mask)."""
    vae_weight: float = 1.0
    """Weight of the VAE's reconstruction of positive-advantage actions (--vae_weight)."""
    vae_kl_weight: float = 0.5
    """Weight of the KL term of the VAE loss (0.5 in the reference, as BCQ)."""
    exploration_noise: float = 0.1
    """Std of the Gaussian exploration noise (online fine-tuning)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "actor_lr", "critic_lr", "value_lr", "vae_lr", "num_qs")
        check_positive(self, "actor_hidden_dims", "critic_hidden_dims", "vae_hidden_dims")
        check_positive(self, "policy_delay")
        check_range(self, "vae_latent_dim", 0, float("inf"))
        for name in _HPARAMS[2:]:  # coefficients and noise scales: >= 0
            check_range(self, name, 0.0, float("inf"))
