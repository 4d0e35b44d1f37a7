"""TD-MPC2 (Hansen et al., 2024, "TD-MPC2: Scalable, Robust World Models for Continuous Control").

A decoder-free world model (encoder, latent dynamics, reward, Q ensemble; SimNorm latents) learned
from multi-step sequences, a policy prior trained on the model's latents, and MPPI planning over
the latent model (``jaxrl.planners``). State observations, single task, online. Follows the
authors' code (nicklashansen/tdmpc2: ``tdmpc2.py``, ``common/world_model.py``, ``layers.py``,
``math.py``, ``scale.py``); where this one differs, ``TDMPC2Config`` says so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import planners, rl
from jaxrl.config import ConfigError, OffPolicyFields, check_positive, check_range
from jaxrl.types import Batch, InfoDict, Params


def heuristic_discount(
    episode_length: int, denom: float = 5, lo: float = 0.95, hi: float = 0.995
) -> float:
    """The authors' discount: ``clip((L/denom - 1) / (L/denom), lo, hi)`` (0.995 for L = 1000)."""
    if episode_length <= 0:
        raise ValueError(f"episode_length must be positive, got {episode_length}.")
    frac = episode_length / denom
    return float(min(max((frac - 1.0) / frac, lo), hi))


def seed_steps(episode_length: int) -> int:
    """The authors' random-action warm-up: ``max(1000, 5 * episode_length)`` env steps."""
    return max(1000, 5 * int(episode_length))


# ----------------------------------------------------------------------------------- networks


class Block(nn.Module):
    """The authors' MLP: [Dense -> (Dropout) -> LayerNorm -> Mish] per hidden layer, Dense out.

    Weights ~ N(0, 0.02^2), biases 0; ``zero_out`` zeroes the output kernel (reward and Q heads);
    ``dropout`` applies to the first layer only; ``simnorm_dim`` adds LayerNorm + SimNorm after
    the output layer (encoder and dynamics).
    """

    hidden_dims: Sequence[int]
    out_dim: int
    simnorm_dim: int | None = None
    dropout: float = 0.0
    zero_out: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """Apply to ``[..., in_dim]``; dropout is active when ``deterministic`` is False."""
        init = nn.initializers.normal(0.02)
        for i, width in enumerate(self.hidden_dims):
            x = nn.Dense(width, kernel_init=init)(x)
            if i == 0 and self.dropout > 0:
                x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
            x = jax.nn.mish(nn.LayerNorm(epsilon=1e-5)(x))
        out_init = nn.initializers.zeros if self.zero_out else init
        x = nn.Dense(self.out_dim, kernel_init=out_init)(x)
        if self.simnorm_dim is not None:
            x = nets.SimNorm(self.simnorm_dim)(nn.LayerNorm(epsilon=1e-5)(x))
        return x


class Modules(NamedTuple):
    """The world model's modules (static: built from the config and the action size)."""

    encoder: Block
    dynamics: Block
    reward: Block
    termination: Block
    policy: Block
    qs: nn.Module


@functools.cache
def make_modules(config: TDMPC2Config, action_dim: int) -> Modules:
    """The networks of the authors' ``WorldModel`` for state observations."""
    c, hidden = config, (config.mlp_dim, config.mlp_dim)
    enc_hidden = (c.enc_dim,) * max(c.num_enc_layers - 1, 1)
    q_ens = nets.ensemble(Block, c.num_q, split_rngs=("params", "dropout"))
    return Modules(
        encoder=Block(enc_hidden, c.latent_dim, simnorm_dim=c.simnorm_dim),
        dynamics=Block(hidden, c.latent_dim, simnorm_dim=c.simnorm_dim),
        reward=Block(hidden, c.num_bins, zero_out=True),
        termination=Block(hidden, 1),
        policy=Block(hidden, 2 * action_dim),
        qs=q_ens(hidden, c.num_bins, None, c.dropout, True),
    )


def squashed_policy(out: jax.Array, key: jax.Array, log_std_min: float, log_std_max: float):
    """Sample the tanh-Gaussian policy prior from its network output ``[..., 2A]``.

    The log-std is squashed smoothly into ``[log_std_min, log_std_max]`` by a tanh. Returns
    ``(action, tanh(mean), entropy, scaled_entropy)``: ``entropy = -log pi(a|z)`` with the tanh
    correction; ``scaled_entropy = -A * log N(u; mean, std)`` of the pre-tanh sample, which is what
    the authors' current ``scaled_entropy`` evaluates to (their ratio cancels the tanh term).
    """
    mean, raw = jnp.split(out, 2, axis=-1)
    log_std = log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(raw) + 1.0)
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    dim = mean.shape[-1]
    gauss_lp = jnp.sum(-0.5 * eps**2 - log_std, axis=-1) - 0.5 * math.log(2 * math.pi) * dim
    action = jnp.tanh(mean + eps * jnp.exp(log_std))
    log_prob = gauss_lp - jnp.sum(jnp.log(nn.relu(1.0 - action**2) + 1e-6), axis=-1)
    return action, jnp.tanh(mean), -log_prob, -dim * gauss_lp


# ----------------------------------------------------------------------------------------- losses


def world_model_loss(
    params: Params, agent: TDMPC2, seq: tuple, key: jax.Array
) -> tuple[jax.Array, tuple[InfoDict, jax.Array]]:
    """TD-MPC2 eq. 4: rho-weighted consistency, reward CE, value CE (+ termination BCE).

    ``seq`` is time-major: obs ``[H+1, B, O]``, actions ``[H, B, A]``, rewards and terminals
    ``[H, B]``. Each term is ``sum_t rho^t (...)_t / H`` (the value term also averaged over the
    Q ensemble); TD targets use the online encoder, a sampled policy action and the minimum of 2
    random target Qs. Returns the loss and ``(info, latents [H+1, B, L])``.
    """
    obs, actions, rewards, terminals = seq
    k_pi, k_pair, k_drop = jax.random.split(key, 3)
    horizon, h = actions.shape[0], agent.hparams
    next_z = jax.lax.stop_gradient(agent.encode(params, obs[1:]))
    next_a = agent.act_prior(agent.policy.params, next_z, k_pi)[0]
    next_q = agent.q_value(agent.target_qs, next_z, next_a, k_pair, "min")
    td = jax.lax.stop_gradient(rewards + h["discount"] * (1.0 - terminals) * next_q)

    def rollout(z: jax.Array, a: jax.Array) -> tuple[jax.Array, jax.Array]:
        z = agent.next(params, z, a)
        return z, z

    z0 = agent.encode(params, obs[0])
    _, pred_z = jax.lax.scan(rollout, z0, actions)
    zs = jnp.concatenate([z0[None], pred_z])
    rho = h["rho"] ** jnp.arange(horizon)
    consistency = jnp.sum(rho * jnp.mean((pred_z - next_z) ** 2, axis=(1, 2))) / horizon
    vmin, vmax = agent.config.vmin, agent.config.vmax
    za = jnp.concatenate([zs[:-1], actions], axis=-1)
    reward_logits = agent.modules.reward.apply(params["reward"], za)
    reward_ce = rl.soft_ce(reward_logits, rewards, vmin, vmax)
    reward_loss = jnp.sum(rho * reward_ce.mean(axis=1)) / horizon
    q_logits = agent.modules.qs.apply(params["qs"], za, False, rngs={"dropout": k_drop})
    q_ce = rl.soft_ce(q_logits, jnp.broadcast_to(td, q_logits.shape[:-1]), vmin, vmax)
    value_loss = jnp.sum(rho * q_ce.mean(axis=(0, 2))) / horizon
    term_loss = jnp.zeros(())
    if agent.config.episodic:
        logits = agent.modules.termination.apply(params["termination"], zs[1:])[..., 0]
        term_loss = optax.sigmoid_binary_cross_entropy(logits, terminals).mean()
    loss = (
        h["consistency_coef"] * consistency
        + h["reward_coef"] * reward_loss
        + h["termination_coef"] * term_loss
        + h["value_coef"] * value_loss
    )
    info = {
        "model/consistency_loss": consistency,
        "model/reward_loss": reward_loss,
        "model/value_loss": value_loss,
        "model/termination_loss": term_loss,
        "model/total_loss": loss,
        "model/td_target": td.mean(),
    }
    return loss, (info, zs)


def policy_loss(
    policy_params: Params, agent: TDMPC2, zs: jax.Array, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """TD-MPC2 eq. 5: ``-sum_t rho^t (Q(z_t, pi(z_t)) / S + entropy_coef * scaled entropy)``.

    On the detached latents ``[H+1, B, L]``; Q is the mean of 2 random online Qs (dropout active,
    no gradient to the Qs), divided by the running scale ``S`` of Q (5th-95th percentile range of
    the first step's Qs, at least 1, Polyak-averaged with ``tau``), updated here first. The
    result is averaged over the ``H+1`` steps, as the authors' code.
    """
    k_pi, k_pair, k_drop = jax.random.split(key, 3)
    action, _, entropy, scaled_entropy = agent.act_prior(policy_params, zs, k_pi)
    qs_params = jax.lax.stop_gradient(agent.model.params["qs"])
    q = agent.q_value(qs_params, zs, action, k_pair, "avg", dropout_key=k_drop)
    low, high = jnp.percentile(jax.lax.stop_gradient(q[0]), jnp.array([5.0, 95.0]))
    scale = agent.q_scale + agent.hparams["tau"] * (jnp.maximum(high - low, 1.0) - agent.q_scale)
    rho = agent.hparams["rho"] ** jnp.arange(zs.shape[0])
    objective = agent.hparams["entropy_coef"] * scaled_entropy + q / scale
    loss = jnp.mean(rho * -objective.mean(axis=1))
    info = {
        "policy/loss": loss,
        "policy/entropy": entropy.mean(),
        "policy/scaled_entropy": scaled_entropy.mean(),
        "policy/q_scale": scale,
    }
    return loss, info


# -------------------------------------------------------------------------------------- the agent


class TDMPC2(struct.PyTreeNode):
    """TD-MPC2 state: world model and policy prior with their optimizers, target Qs, Q scale."""

    rng: jax.Array
    model: TrainState  # params: encoder, dynamics, reward, qs (+ termination)
    policy: TrainState
    target_qs: Params
    q_scale: jax.Array
    hparams: dict[str, jax.Array]
    action_dim: int = struct.field(pytree_node=False)
    config: TDMPC2Config = struct.field(pytree_node=False)

    @property
    def modules(self) -> Modules:
        """The (static) networks."""
        return make_modules(self.config, self.action_dim)

    def encode(self, params: Params, obs: jax.Array) -> jax.Array:
        """Latent state of observations ``[..., O]``."""
        return self.modules.encoder.apply(params["encoder"], obs)

    def next(self, params: Params, z: jax.Array, a: jax.Array) -> jax.Array:
        """Next latent state."""
        return self.modules.dynamics.apply(params["dynamics"], jnp.concatenate([z, a], axis=-1))

    def act_prior(self, policy_params: Params, z: jax.Array, key: jax.Array) -> tuple:
        """``squashed_policy`` of the policy prior at latents ``z``."""
        out = self.modules.policy.apply(policy_params, z)
        return squashed_policy(out, key, self.config.log_std_min, self.config.log_std_max)

    def q_value(
        self, qs_params: Params, z: jax.Array, a: jax.Array, key: jax.Array, reduce: str, **kw
    ) -> jax.Array:
        """Min ('min') or mean ('avg') of 2 random ensemble members' decoded Q-values."""
        za = jnp.concatenate([z, a], axis=-1)
        drop = kw.get("dropout_key")
        rngs = {} if drop is None else {"dropout": drop}
        logits = self.modules.qs.apply(qs_params, za, drop is None, rngs=rngs)
        pair = jax.random.choice(key, self.config.num_q, (2,), replace=False)
        q = rl.two_hot_inv(logits[pair], self.config.vmin, self.config.vmax)
        return q.min(axis=0) if reduce == "min" else q.mean(axis=0)

    def update(self, batch: Batch) -> tuple[TDMPC2, InfoDict]:
        """A world-model step, a policy step on the detached latents, then the target-Q update."""
        if batch.obs.ndim != 3 or batch.obs.shape[1] != self.config.horizon:
            raise ValueError(
                "TDMPC2.update needs sequence batches with leaves [B, horizon, ...] "
                f"(horizon={self.config.horizon}), got obs of shape {batch.obs.shape}."
            )
        tm = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  (time-major)
        obs = tm(jnp.concatenate([batch.obs[:, :1], batch.next_obs], axis=1))
        seq = (obs, tm(batch.action), tm(batch.reward), tm(batch.terminal.astype(obs.dtype)))
        rng, k_model, k_policy = jax.random.split(self.rng, 3)
        grads, (info, zs) = jax.grad(world_model_loss, has_aux=True)(
            self.model.params, self, seq, k_model
        )
        agent = self.replace(rng=rng, model=self.model.apply_gradients(grads=grads))
        zs = jax.lax.stop_gradient(zs)
        policy, pi_info = nets.gradient_step(agent.policy, policy_loss, agent, zs, k_policy)
        target = rl.polyak_update(agent.model.params["qs"], agent.target_qs, self.hparams["tau"])
        agent = agent.replace(policy=policy, target_qs=target, q_scale=pi_info["policy/q_scale"])
        return agent, {**info, "model/grad_norm": optax.global_norm(grads), **pi_info}

    # -------------------------------------------------------------------------------- acting

    @property
    def planner(self) -> planners.PlannerConfig:
        """MPPI settings (+2 iterations for 20 or more action dimensions, as the authors)."""
        return self.config.planner_config(self.action_dim)

    def init_plan(self, num_envs: int) -> planners.PlanState:
        """Zero warm starts ``[num_envs, H, A]``."""
        return planners.init_plan(self.planner, self.action_dim, (num_envs,))

    def _act_one(self, plan, obs, first, key, explore: bool):
        k_pi, k_plan, k_noise = jax.random.split(key, 3)
        params, c, gamma = self.model.params, self.config, self.hparams["discount"]
        z = self.encode(params, obs)
        if not c.mpc:
            action, mean = self.act_prior(self.policy.params, z, k_pi)[:2]
            return (action if explore else mean), plan

        def rollout_prior(z: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
            a = self.act_prior(self.policy.params, z, key)[0]
            return self.next(params, z, a), a

        pi_actions = None
        if c.num_pi_trajs > 0:
            z_pi = jnp.broadcast_to(z, (c.num_pi_trajs, *z.shape))
            _, pi_actions = jax.lax.scan(rollout_prior, z_pi, jax.random.split(k_pi, c.horizon))
            pi_actions = jnp.swapaxes(pi_actions, 0, 1)

        def value_fn(actions: jax.Array, key: jax.Array) -> jax.Array:
            zt = jnp.broadcast_to(z, (actions.shape[0], *z.shape))
            ret, discount, done = 0.0, 1.0, jnp.zeros(actions.shape[0])
            for t in range(actions.shape[1]):
                za = jnp.concatenate([zt, actions[:, t]], axis=-1)
                reward = rl.two_hot_inv(
                    self.modules.reward.apply(params["reward"], za), c.vmin, c.vmax
                )
                zt = self.next(params, zt, actions[:, t])
                ret, discount = ret + discount * (1.0 - done) * reward, discount * gamma
                if c.episodic:
                    logit = self.modules.termination.apply(params["termination"], zt)[..., 0]
                    done = jnp.minimum(done + (logit > 0.0), 1.0)
            k_a, k_pair = jax.random.split(key)
            a = self.act_prior(self.policy.params, zt, k_a)[0]
            q = self.q_value(params["qs"], zt, a, k_pair, "avg")
            return ret + discount * (1.0 - done) * q

        result, plan = planners.plan(self.planner, value_fn, plan, first, k_plan, pi_actions)
        action = result.actions[0]
        if explore:
            action = action + result.std[0] * jax.random.normal(k_noise, action.shape)
        return jnp.clip(action, -1.0, 1.0), plan

    def plan_actions(
        self,
        plan: planners.PlanState,
        obs: jax.Array,
        first: jax.Array,
        key: jax.Array,
        explore: bool,
    ) -> tuple[jax.Array, planners.PlanState]:
        """Plan for ``obs [n, O]`` (``first [n]`` drops the warm start); actions ``[n, A]``.

        ``explore`` (static) adds ``std[0]`` Gaussian noise to the first planned action.
        """
        keys = jax.random.split(key, obs.shape[0])
        act = functools.partial(self._act_one, explore=explore)
        return jax.vmap(act)(plan, obs, jnp.asarray(first, bool), keys)

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Exploration actions from a fresh plan (no warm start) for ``obs [n, O]``."""
        plan = self.init_plan(obs.shape[0])
        return self.plan_actions(plan, obs, jnp.ones(obs.shape[0], bool), rng, True)[0]

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Planned actions without exploration noise, from a fresh plan and a fixed key."""
        plan = self.init_plan(obs.shape[0])
        first = jnp.ones(obs.shape[0], bool)
        return self.plan_actions(plan, obs, first, jax.random.key(0), False)[0]

    @classmethod
    def create(
        cls, config: TDMPC2Config, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> TDMPC2:
        """Initialize from one observation ``[O]`` and action ``[A]``; ``seed`` may be traced."""
        if obs_example.ndim != 1:
            raise ValueError(
                f"TDMPC2 takes state observations of shape [obs_dim], got {obs_example.shape}."
            )
        action_dim = int(action_example.shape[-1])
        m, c = make_modules(config, action_dim), config
        rng, *keys = jax.random.split(jax.random.key(seed), 7)
        z = jnp.zeros((1, c.latent_dim))
        za = jnp.zeros((1, c.latent_dim + action_dim))
        params = {
            "encoder": m.encoder.init(keys[0], obs_example[None]),
            "dynamics": m.dynamics.init(keys[1], za),
            "reward": m.reward.init(keys[2], za),
            "qs": m.qs.init(keys[3], za, True),
        }
        if c.episodic:
            params["termination"] = m.termination.init(keys[4], z)
        model_tx = optax.inject_hyperparams(_adam, static_args=("max_grad_norm", "eps"))(
            learning_rate=c.lr, enc_lr_scale=c.enc_lr_scale, max_grad_norm=c.grad_clip_norm
        )
        pi_tx = optax.inject_hyperparams(_adam, static_args=("max_grad_norm", "eps"))(
            learning_rate=c.lr, enc_lr_scale=1.0, max_grad_norm=c.grad_clip_norm, eps=1e-5
        )
        model = TrainState.create(apply_fn=None, params=params, tx=model_tx)
        policy = TrainState.create(apply_fn=None, params=m.policy.init(keys[5], z), tx=pi_tx)
        hparams = nets.hparam_leaves(config, *HPARAMS)
        target = jax.tree.map(jnp.copy, params["qs"])
        return cls(rng, model, policy, target, jnp.ones(()), hparams, action_dim, config)


def _adam(
    learning_rate: jax.Array, enc_lr_scale: jax.Array, max_grad_norm: float, eps: float = 1e-8
) -> optax.GradientTransformation:
    # Adam's step is linear in its rate, so scaling the encoder's updates is the authors'
    # encoder parameter group with lr * enc_lr_scale; the clip is over all parameters.
    encoder_only = lambda params: {name: name == "encoder" for name in params}  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adam(learning_rate, eps=eps),
        optax.masked(optax.scale(enc_lr_scale), encoder_only),
    )


HPARAMS = (
    "discount", "tau", "rho", "consistency_coef", "reward_coef", "value_coef",
    "termination_coef", "entropy_coef",
)  # fmt: skip
"""Config floats held as pytree leaves in ``TDMPC2.hparams`` (sweepable without recompiling)."""


# ------------------------------------------------------------------------------------------ config


@dataclasses.dataclass(frozen=True, kw_only=True)
class TDMPC2Config(OffPolicyFields):
    """TD-MPC2 hyperparameters: the authors' ``config.yaml`` defaults (5M-parameter model).

    Differences from the authors' code: ``discount`` is a plain field (theirs is computed from the
    episode length; the CLI sets it with ``heuristic_discount``, 0.995 for 1000-step episodes,
    and ``learning_starts`` with ``seed_steps``); batches are ``[B, horizon, ...]`` sequences
    from the shared buffer; single task only (no task embeddings or action masks); the
    authors' one-off pretraining burst of ``seed_steps`` updates is the loop's business; NaN
    plan values rank last (``jaxrl.planners``) instead of counting as 0.
    """

    tau: float = 0.01
    learning_starts: int = 5_000  # seed_steps(1000)

    lr: float = 3e-4
    """Adam learning rate of the world model and the policy prior."""
    enc_lr_scale: float = 0.3
    """Encoder learning rate as a fraction of lr."""
    grad_clip_norm: float = 20.0
    """Global gradient-norm clip of the world model and (separately) of the policy."""
    consistency_coef: float = 20.0
    """Weight of the latent consistency loss."""
    reward_coef: float = 0.1
    """Weight of the reward cross-entropy loss."""
    value_coef: float = 0.1
    """Weight of the value cross-entropy loss."""
    termination_coef: float = 1.0
    """Weight of the termination loss (episodic only)."""
    entropy_coef: float = 1e-4
    """Weight of the action-dim-scaled entropy bonus of the policy loss."""
    rho: float = 0.5
    """Per-step decay of the loss weights over the horizon."""
    episodic: bool = False
    """Learn a termination head and stop planned returns at predicted terminations."""
    latent_dim: int = 512
    """Width of the latent state (a multiple of simnorm_dim)."""
    mlp_dim: int = 512
    """Hidden width of dynamics, reward, termination, policy and Q networks (2 layers each)."""
    enc_dim: int = 256
    """Hidden width of the encoder."""
    num_enc_layers: int = 2
    """Encoder layers (hidden layers = max(num_enc_layers - 1, 1))."""
    num_q: int = 5
    """Q-functions in the ensemble (at least 2)."""
    dropout: float = 0.01
    """Dropout rate of the Q-functions' first layer."""
    simnorm_dim: int = 8
    """Group size of the SimNorm latent normalization."""
    log_std_min: float = -10.0
    """Lower bound of the policy's log-std."""
    log_std_max: float = 2.0
    """Upper bound of the policy's log-std."""
    num_bins: int = 101
    """Bins of the two-hot reward and value regression."""
    vmin: float = -10.0
    """Lowest bin (symlog space)."""
    vmax: float = 10.0
    """Highest bin (symlog space)."""
    mpc: bool = True
    """Act by MPPI planning (True) or with the policy prior alone."""
    horizon: int = 3
    """Planning horizon and length of the training sequences."""
    iterations: int = 6
    """MPPI iterations (+2 when the action has 20 or more dimensions)."""
    num_samples: int = 512
    """Action sequences per MPPI iteration, policy trajectories included."""
    num_elites: int = 64
    """Elite sequences that refit the MPPI distribution."""
    num_pi_trajs: int = 24
    """Sequences from rolling the policy prior through the model, per iteration."""
    min_std: float = 0.05
    """Lower clip of the MPPI standard deviation."""
    max_std: float = 2.0
    """Initial MPPI standard deviation and its upper clip."""
    temperature: float = 0.5
    """Inverse temperature of the MPPI weights exp(temperature * (V - max V))."""

    def planner_config(self, action_dim: int = 1) -> planners.PlannerConfig:
        """The MPPI settings for an action of ``action_dim`` dimensions."""
        return planners.PlannerConfig(
            method="mppi",
            horizon=self.horizon,
            num_samples=self.num_samples,
            num_elites=self.num_elites,
            iterations=self.iterations + 2 * int(action_dim >= 20),
            temperature=self.temperature,
            min_std=self.min_std,
            max_std=self.max_std,
            num_policy_samples=self.num_pi_trajs,
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "lr", "enc_lr_scale", "grad_clip_norm", "latent_dim", "mlp_dim")
        check_positive(self, "enc_dim", "num_enc_layers", "simnorm_dim", "horizon", "iterations")
        check_positive(self, "num_samples", "num_elites", "temperature", "max_std")
        check_range(self, "rho", 0.0, 1.0, low_open=True)
        check_range(self, "dropout", 0.0, 0.99)
        check_range(self, "num_pi_trajs", 0, float("inf"))
        for name in ("consistency_coef", "reward_coef", "value_coef", "termination_coef"):
            check_range(self, name, 0.0, float("inf"))
        check_range(self, "entropy_coef", 0.0, float("inf"))
        problems = [
            (self.num_q < 2, f"num_q must be >= 2 (2 random Qs are drawn), got {self.num_q}"),
            (self.num_bins < 2, f"num_bins must be >= 2, got {self.num_bins}"),
            (self.vmin >= self.vmax, f"vmin ({self.vmin}) must be < vmax ({self.vmax})"),
            (self.log_std_min >= self.log_std_max, "log_std_min must be < log_std_max"),
            (
                self.latent_dim % self.simnorm_dim != 0,
                f"latent_dim ({self.latent_dim}) must be a multiple of simnorm_dim "
                f"({self.simnorm_dim})",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(f"TDMPC2Config: {message}; set the flag accordingly.")
        self.planner_config()  # the planner's own checks: elites <= samples, min_std <= max_std
