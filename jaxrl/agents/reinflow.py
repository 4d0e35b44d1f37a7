"""ReinFlow (Zhang et al., 2025, arXiv:2505.22094): a flow policy fine-tuned by PPO on noise.

A flow policy ``v(x, t, s)`` is cloned from a dataset (1-rectified flow and an EMA; ``update``
on ``Transition`` minibatches, the offline loop). A noise network ``sigma(t, s)`` then makes the
``K`` Euler steps a Markov chain of Gaussians with an exact likelihood, on which PPO trains both
networks and a state-value critic (``update`` on a ``Rollout``, the fused loop). The segments,
per-minibatch GAE, value loss and shuffled epochs are PPO's (``jaxrl.agents.ppo``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import generative as gen
from jaxrl import rl
from jaxrl.agents.ppo import gae_minibatch, rollout_segments, sgd_epochs, value_loss
from jaxrl.config import ConfigError, check_positive, check_range
from jaxrl.networks import MLP, ValueNetwork, gradient_step, hparam_leaves
from jaxrl.types import InfoDict, Params, Rollout, Transition

_LOG_2PI_E = math.log(2.0 * math.pi * math.e)
TIME_DIM = 16  # the authors' width of the sinusoidal time code


class NoisyFlow(nn.Module):
    """The velocity ``v(x_t, t, s)`` and the noise head's pre-squash output ``h(t, s)``.

    The noise head is ReinFlow's noise network: an MLP on the time code (no gradient) and the
    state, never on ``x_t``; ``noise_std`` squashes its output into ``[min_std, max_std]``.
    """

    action_dim: int
    hidden_dims: Sequence[int]
    time_dim: int
    noise_hidden_dims: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, x: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(velocity, h)``, both ``[..., action_dim]``, for times ``t [..., 1]``."""
        # The velocity net is ``bc``'s (same structure), so the BC weights load into it.
        velocity = _velocity_net(self.action_dim, self.hidden_dims, self.time_dim, "velocity")
        noise = MLP((*self.noise_hidden_dims, self.action_dim), nn.tanh, name="noise")
        temb = jax.lax.stop_gradient(gen.sinusoidal_embedding(t, self.time_dim))
        return velocity(obs, x, t), noise(jnp.concatenate([temb, obs], axis=-1))


def _velocity_net(dim: int, hidden: Sequence[int], time_dim: int, name: str | None = None) -> Any:
    return gen.DenoiserNet(dim, tuple(hidden), time_dim=time_dim, activation=nn.relu, name=name)


def noise_std(h: jax.Array, min_std: jax.Array, max_std: jax.Array) -> jax.Array:
    """ReinFlow's std ``exp((lv_min + (lv_max - lv_min) (tanh(h) + 1) / 2) / 2)``, in [min, max]."""
    lv_min, lv_max = 2.0 * jnp.log(min_std), 2.0 * jnp.log(max_std)
    return jnp.exp(0.5 * (lv_min + (lv_max - lv_min) * (jnp.tanh(h) + 1.0) / 2.0))


# ----------------------------------------------------------------------------------------- losses


def chain_log_prob(
    params: Params, agent: ReinFlow, obs: jax.Array, chain: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The chain's log-likelihood and entropy per action dimension and step, and the noise std.

    ReinFlow's eq. for the Markov chain: ``log N(x_0; 0, I) + sum_k log N(x_{k+1}; mu_k,
    sigma_k^2)`` with ``mu_k = clip(x_k + v(x_k, t_k, s) / K, -1, 1)``, ``t_k = k / K``, summed
    over dimensions, divided by ``(K + 1) A`` and clipped to ``[logprob_min, logprob_max]``
    (the authors' Gym setting). The entropy of the Gaussian chain is normalized the same way.

    ``obs [N, obs_dim]``, ``chain [N, K + 1, A]`` (``x_0 .. x_K``, ``x_K`` the action);
    returns ``(log_prob [N], entropy [N], std [N, K, A])``.
    """
    hp = agent.hparams
    num_steps, dim = chain.shape[-2] - 1, chain.shape[-1]
    x = chain[..., :-1, :]
    t = jnp.broadcast_to(jnp.arange(num_steps)[:, None] / num_steps, (*x.shape[:-1], 1))
    obs = jnp.broadcast_to(obs[..., None, :], (*x.shape[:-1], obs.shape[-1]))
    velocity, h = agent.actor.apply_fn(params, obs, x, t)
    mean = jnp.clip(x + velocity / num_steps, -1.0, 1.0)
    std = noise_std(h, hp["min_std"], hp["max_std"])
    log_prob = jax.scipy.stats.norm.logpdf(chain[..., 1:, :], mean, std).sum((-2, -1))
    log_prob += jax.scipy.stats.norm.logpdf(chain[..., 0, :]).sum(-1)
    entropy = 0.5 * _LOG_2PI_E * dim + jnp.sum(jnp.log(std) + 0.5 * _LOG_2PI_E, axis=(-2, -1))
    size = (num_steps + 1) * dim
    log_prob = jnp.clip(log_prob / size, hp["logprob_min"], hp["logprob_max"])
    return log_prob, entropy / size, std


def policy_loss(params: Params, agent: ReinFlow, batch: dict) -> tuple[jax.Array, InfoDict]:
    """PPO's clipped surrogate (Schulman et al., 2017, eq. 7) on the chain's likelihood ratio.

    ReinFlow's objective: the ratio of normalized chain log-likelihoods, advantages normalized
    per minibatch, minus ``ent_coef`` times the normalized chain entropy.
    """
    hp = agent.hparams
    log_prob, entropy, std = chain_log_prob(params, agent, batch["obs"], batch["chain"])
    log_ratio = log_prob - batch["log_prob"]
    ratio = jnp.exp(log_ratio)
    adv = batch["advantage"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = jnp.mean(rl.ppo_clipped_objective(ratio, adv, hp["clip_eps"]))
    loss = -surrogate - hp["ent_coef"] * entropy.mean()
    kl = jnp.mean(ratio - 1.0 - log_ratio)  # Schulman's k3 estimator
    clip_frac = jnp.mean(jnp.abs(ratio - 1.0) > hp["clip_eps"])
    info = {"actor/loss": -surrogate, "actor/entropy": entropy.mean(), "actor/std": std.mean()}
    return loss, info | {"actor/approx_kl": kl, "actor/clip_frac": clip_frac}


def bc_loss(params: Params, agent: ReinFlow, batch: Transition, key: jax.Array) -> tuple:
    """1-rectified flow BC: ``E ||v(x_t, t, s) - (a - x_0)||^2``, ``x_t = t a + (1 - t) x_0``.

    Liu et al. (2023), as ReinFlow's pretraining (mean over action dimensions, ``t ~ U[0, 1]``).
    """
    fn = partial(agent.bc.apply_fn, params, batch.obs)
    loss = jnp.mean(gen.flow_matching_loss(fn, key, batch.action)) / batch.action.shape[-1]
    return loss, {"bc/loss": loss}


# -------------------------------------------------------------------------------------- the agent


class ReinFlow(struct.PyTreeNode):
    """The BC flow, the actor (its velocity net the BC flow's EMA while cloning), the critic.

    Sweepable leaves: the learning rates and weight decays in each ``opt_state``, ``hparams``.
    """

    on_policy: ClassVar[bool] = True

    rng: jax.Array
    bc: TrainState
    actor: TrainState
    value: TrainState
    hparams: dict[str, jax.Array]
    num_updates: jax.Array
    action_dim: int = struct.field(pytree_node=False)
    config: ReinFlowConfig = struct.field(pytree_node=False)

    def update(self, batch: Transition | Rollout) -> tuple[ReinFlow, InfoDict]:
        """PPO on a ``Rollout`` (fine-tuning); one BC step on a ``Transition`` minibatch."""
        if isinstance(batch, Rollout):
            return self._ppo_update(batch)
        return self._bc_update(batch)

    def _bc_update(self, batch: Transition) -> tuple[ReinFlow, InfoDict]:
        rng, key = jax.random.split(self.rng)
        bc, info = gradient_step(self.bc, bc_loss, self, batch, key)
        params = self.actor.params["params"]
        ema = rl.polyak_update(bc.params["params"], params["velocity"], 1 - self.hparams["ema"])
        actor = self.actor.replace(params={"params": {**params, "velocity": ema}})
        return self.replace(rng=rng, bc=bc, actor=actor), info

    def _ppo_update(self, rollout: Rollout) -> tuple[ReinFlow, InfoDict]:
        """``num_epochs`` of PPO minibatch steps (as ``PPO.update``), until the KL > ``target_kl``.

        The first ``critic_warmup_updates`` updates train the critic only. Info: means of steps.
        """
        cfg, hp = self.config, self.hparams
        num_steps, num_envs = rollout.reward.shape
        n, unroll = num_steps * num_envs, cfg.unroll_length
        if num_steps % unroll or (n // unroll) % cfg.num_minibatches:
            fix = "collect rollout_length(num_envs) steps per env"
            raise ValueError(f"A {num_steps} x {num_envs} rollout does not fit PPO's split; {fix}.")
        fields = ("obs", "next_obs", "reward", "terminated", "truncated")
        data = {k: getattr(rollout, k) for k in fields} | rollout.extras  # chain, log_prob
        warmup = self.num_updates < hp["critic_warmup_updates"]
        keep = lambda flag, old, new: jax.tree.map(partial(jnp.where, flag), old, new)  # noqa: E731

        def minibatch_step(carry, segments):
            (actor, value, stopped), key = carry
            agent = self.replace(actor=actor, value=value)
            batch = gae_minibatch(agent, segments)
            a_grads, a_info = jax.grad(policy_loss, has_aux=True)(actor.params, agent, batch)
            v_grads, v_info = jax.grad(value_loss, has_aux=True)(value.params, agent, batch)
            actor = keep(stopped | warmup, actor, actor.apply_gradients(grads=a_grads))
            value = keep(stopped, value, value.apply_gradients(grads=v_grads))
            # The authors' early stop: no more steps in this update once the KL is too large.
            stopped = stopped | (a_info["actor/approx_kl"] > hp["target_kl"])
            info = {**a_info, **v_info, "ppo/stopped": stopped.astype(jnp.float32)}
            return ((actor, value, stopped), key), info

        rng, key = jax.random.split(self.rng)
        carry, data = (self.actor, self.value, jnp.bool_(False)), rollout_segments(data, unroll)
        epochs = (cfg.num_epochs, cfg.num_minibatches)
        (actor, value, _), info = sgd_epochs(minibatch_step, carry, data, key, *epochs)
        info = jax.tree.map(jnp.mean, info)
        agent = self.replace(rng=rng, actor=actor, value=value, num_updates=self.num_updates + 1)
        return agent, info

    def chain(self, obs: jax.Array, x0: jax.Array, eps: jax.Array) -> jax.Array:
        """The iterates ``[N, K + 1, A]`` from ``x0 [N, A]`` and standard noise ``eps [K, N, A]``.

        ``x_{k+1} = clip(x_k + v(x_k, t_k, s) / K, -1, 1) + sigma_k(s) eps_k``; the last
        iterate (the action) is clipped to ``[-1, 1]``. ``eps = 0`` is the noiseless sampler.
        """
        hp, num_steps = self.hparams, self.config.flow_steps

        def step(x: jax.Array, inputs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            k, e = inputs
            t = jnp.full((*x.shape[:-1], 1), k / num_steps, jnp.float32)
            velocity, h = self.actor.apply_fn(self.actor.params, obs, x, t)
            mean = jnp.clip(x + velocity / num_steps, -1.0, 1.0)
            x = mean + noise_std(h, hp["min_std"], hp["max_std"]) * e
            return x, x

        steps = jnp.arange(num_steps, dtype=jnp.float32)
        _, xs = jax.lax.scan(step, x0, (steps, eps))
        xs = xs.at[-1].set(jnp.clip(xs[-1], -1.0, 1.0))
        return jnp.swapaxes(jnp.concatenate([x0[None], xs], axis=0), 0, 1)

    def policy_step(self, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(action [N, A] in [-1, 1], {"chain": [N, K + 1, A], "log_prob": [N]})`` for ``obs``.

        The noisy chain (noise truncated at 3 sigma) and its likelihood (``chain_log_prob``).
        """
        k_x0, k_eps = jax.random.split(key)
        dim, num_steps = self.action_dim, self.config.flow_steps
        x0 = jax.random.normal(k_x0, (obs.shape[0], dim))
        eps = jnp.clip(jax.random.normal(k_eps, (num_steps, obs.shape[0], dim)), -3.0, 3.0)
        chain = self.chain(obs, x0, eps)
        log_prob, _, _ = chain_log_prob(self.actor.params, self, obs, chain)
        return chain[:, -1], {"chain": chain, "log_prob": log_prob}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Actions of the noisy chain (as ``policy_step``)."""
        return self.policy_step(obs, rng)[0]

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """The noiseless Euler sampler from ``x_0 = 0``: deterministic, in [-1, 1]."""
        x0 = jnp.zeros((obs.shape[0], self.action_dim), jnp.float32)
        eps = jnp.zeros((self.config.flow_steps, *x0.shape), jnp.float32)
        return self.chain(obs, x0, eps)[:, -1]

    @classmethod
    def create(
        cls, config: ReinFlowConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> ReinFlow:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_bc, k_actor, k_value = jax.random.split(jax.random.key(seed), 4)
        obs, act = obs_example[None], action_example[None]
        dim = action_example.shape[-1]
        velocity = _velocity_net(dim, config.velocity_hidden_dims, TIME_DIM)
        bc_tx = optax.inject_hyperparams(_bc_adam, static_args=("decay_steps", "final_fraction"))(
            learning_rate=config.bc_lr,
            decay_steps=gen.cosine_horizon(config.bc_decay_steps),
            final_fraction=config.bc_final_lr / config.bc_lr,
        )
        bc_params = velocity.init(k_bc, obs, act, act[:, :1])
        bc = TrainState.create(apply_fn=velocity.apply, params=bc_params, tx=bc_tx)
        sizes = (config.velocity_hidden_dims, TIME_DIM, config.noise_hidden_dims)
        flow = NoisyFlow(dim, *sizes)
        params = flow.init(k_actor, obs, act, act[:, :1])["params"]
        # The fine-tuned velocity starts as the BC flow (its EMA while cloning).
        params = {"params": {**params, "velocity": jax.tree.map(jnp.copy, bc_params["params"])}}
        adamw = optax.inject_hyperparams(optax.adamw)
        actor_tx = adamw(learning_rate=config.actor_lr, weight_decay=config.actor_weight_decay)
        actor = TrainState.create(apply_fn=flow.apply, params=params, tx=actor_tx)
        critic = ValueNetwork(config.critic_hidden_dims, gen.mish)
        v_tx = adamw(learning_rate=config.critic_lr, weight_decay=config.critic_weight_decay)
        value = TrainState.create(apply_fn=critic.apply, params=critic.init(k_value, obs), tx=v_tx)
        names = ("ema", "clip_eps", "ent_coef", "vf_coef", "discount", "gae_lambda")
        names += ("reward_scaling", "min_std", "max_std", "logprob_min", "logprob_max")
        names += ("critic_warmup_updates",)
        hparams = hparam_leaves(config, *names)
        hparams["target_kl"] = jnp.float32(config.target_kl or jnp.inf)
        return cls(rng, bc, actor, value, hparams, jnp.zeros((), jnp.int32), dim, config)


def _bc_adam(learning_rate: jax.Array, decay_steps: int | None, final_fraction: float) -> Any:
    # The base rate stays an injected leaf (sweepable); only the cosine factor is scheduled.
    if decay_steps is None:
        return optax.adam(learning_rate)
    cosine = optax.cosine_decay_schedule(1.0, decay_steps, alpha=final_fraction)
    return optax.adam(lambda count: learning_rate * cosine(count))


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class ReinFlowConfig:
    """ReinFlow hyperparameters; defaults: the authors' Gym hopper settings (ReinFlow/ReinFlow).

    Deviations: one action per decision (theirs: chunks of 4 on MuJoCo); PPO's segments and
    per-minibatch GAE, time limits bootstrapped from V(final obs); ``t_k = k / K`` in sampler
    and likelihood alike; a constant reward scale (theirs: running scaling); constant PPO rates
    (theirs: warm-up, cosine cycles); fixed noise bounds (they decay ``max_std``); the noise net
    reads the sinusoidal time code (theirs: the velocity net's learned one, detached); plain
    MLPs (theirs: residual); raw observations (theirs: scaled to [-1, 1] by the data's range);
    evaluation from ``x_0 = 0`` (theirs: ``x_0 ~ N(0, I)``, no injected noise either way).
    """

    batch_size: int = 128
    """Rows of each BC minibatch (the offline loop's pretraining)."""
    bc_lr: float = 1e-3
    """Adam learning rate of the BC flow."""
    bc_final_lr: float = 1e-4
    """Learning rate the BC flow's cosine decay ends at."""
    bc_decay_steps: int | None = None
    """BC updates of the cosine decay (None: the offline phase's steps when run; 0: constant)."""
    ema: float = 0.995
    """Decay of the BC flow's moving average, the weights fine-tuning starts from."""
    actor_lr: float = 4.5e-5
    """AdamW learning rate of the velocity and noise networks during fine-tuning."""
    actor_weight_decay: float = 0.0
    """AdamW weight decay of the actor."""
    critic_lr: float = 6.5e-4
    """AdamW learning rate of the critic."""
    critic_weight_decay: float = 1e-5
    """AdamW weight decay of the critic."""
    flow_steps: int = 4
    """Euler steps K of the flow (sampling, the noisy chain and its likelihood)."""
    min_std: float = 0.10
    """Lower bound of the injected noise's standard deviation."""
    max_std: float = 0.24
    """Upper bound of the injected noise's standard deviation."""
    logprob_min: float = -1.0
    """Lower clip of the normalized chain log-likelihood."""
    logprob_max: float = 1.0
    """Upper clip of the normalized chain log-likelihood."""
    clip_eps: float = 0.01
    """PPO's ratio clipping range."""
    ent_coef: float = 0.03
    """Weight of the chain's normalized entropy in the actor loss."""
    vf_coef: float = 0.5
    """Value-loss coefficient; the value loss is 0.5 * vf_coef * mean squared error."""
    target_kl: float | None = 1.0
    """Stop an update's minibatch steps once the approximate KL exceeds this (None: never)."""
    discount: float = 0.99
    """Discount factor gamma."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    reward_scaling: float = 1.0
    """Multiply rewards by this before GAE."""
    bootstrap_truncated: bool = True
    """Bootstrap time-limit steps from V(final obs) (``PPOConfig.bootstrap_truncated``)."""
    critic_warmup_updates: int = 0
    """PPO updates at the start of fine-tuning in which only the critic learns."""
    unroll_length: int = 25
    """Steps per rollout segment, the horizon of GAE before bootstrapping from V."""
    minibatch_segments: int = 32
    """Segments per PPO minibatch (minibatch_segments * unroll_length transitions)."""
    num_minibatches: int = 8
    """PPO minibatches per epoch."""
    num_epochs: int = 5
    """Epochs of minibatch PPO over each rollout."""
    velocity_hidden_dims: tuple[int, ...] = (512, 512, 512)
    """Hidden layer widths of the velocity network."""
    noise_hidden_dims: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the (tanh) noise network."""
    critic_hidden_dims: tuple[int, ...] = (256, 256, 256)
    """Hidden layer widths of the (mish) critic."""

    def rollout_length(self, num_envs: int) -> int:
        """Env steps per env per PPO update: ``unroll_length * segments // num_envs`` (Brax's).

        ``segments = minibatch_segments * num_minibatches``; ``ConfigError`` unless ``num_envs``
        (a positive int) divides it.
        """
        segments = self.minibatch_segments * self.num_minibatches
        if type(num_envs) is not int or num_envs <= 0 or segments % num_envs:
            raise ConfigError(
                f"ReinFlow needs minibatch_segments * num_minibatches ({segments}) to be "
                f"divisible by num_envs ({num_envs}); choose --num-envs dividing {segments}, or "
                "set --minibatch-segments / --num-minibatches."
            )
        return self.unroll_length * segments // num_envs

    def __post_init__(self) -> None:
        check_positive(
            self,
            *("batch_size", "bc_lr", "bc_final_lr", "actor_lr", "critic_lr", "flow_steps"),
            *("min_std", "max_std", "clip_eps", "vf_coef", "target_kl", "reward_scaling"),
            *("unroll_length", "minibatch_segments", "num_minibatches", "num_epochs"),
            *("velocity_hidden_dims", "noise_hidden_dims", "critic_hidden_dims"),
        )
        for name in ("ema", "discount", "gae_lambda"):
            check_range(self, name, 0.0, 1.0)
        for name in ("ent_coef", "actor_weight_decay", "critic_weight_decay"):
            check_range(self, name, 0.0, float("inf"))
        check_range(self, "critic_warmup_updates", 0, float("inf"))
        if self.bc_decay_steps is not None:
            check_range(self, "bc_decay_steps", 0, float("inf"))
        check_range(self, "max_std", self.min_std, float("inf"))
        check_range(self, "logprob_max", self.logprob_min, float("inf"), low_open=True)


__all__ = ["NoisyFlow", "ReinFlow", "ReinFlowConfig", "bc_loss", "chain_log_prob", "noise_std"]
__all__ += ["policy_loss"]
