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
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import planners, rl
from jaxrl.agents.tdmpc2_model import (
    MODEL_SIZES,
    Sizes,
    adam,
    config_problems,
    heuristic_discount,
    make_modules,
    plan_value,
    prior_actions,
    seed_steps,
    squashed_policy,
    tdmpc2_env_defaults,
)
from jaxrl.agents.tdmpc2_model import sizes as _sizes
from jaxrl.config import ConfigError, OffPolicyFields, check_positive, check_range
from jaxrl.types import Batch, InfoDict, Params

# The world model's networks and rollouts live in ``tdmpc2_model``; the env-derived settings
# stay importable from here (the registry and tests import them from this module).
__all__ = ["TDMPC2", "TDMPC2Config", "policy_loss", "world_model_loss"]
__all__ += ["MODEL_SIZES", "Sizes", "heuristic_discount", "seed_steps", "tdmpc2_env_defaults"]


# ----------------------------------------------------------------------------------------- losses


def world_model_loss(
    params: Params, agent: TDMPC2, seq: tuple, key: jax.Array
) -> tuple[jax.Array, tuple[InfoDict, jax.Array]]:
    """TD-MPC2's model objective (Hansen et al., 2024, Sec. 3): consistency + reward CE + value CE.

    ``seq`` is time-major: obs ``[H+1, B, O]``, actions ``[H, B, A]``, rewards and terminals
    ``[H, B]``. Each term is ``sum_t rho^t (...)_t / H`` (the value term also averaged over the
    Q ensemble), plus the termination BCE when episodic. TD targets bootstrap from the encoded
    next observations with a sampled policy action and the minimum of 2 random target Qs.
    Returns the loss and ``(info, latents [H+1, B, L])``.
    """
    obs, actions, rewards, terminals = seq
    m, h, c = agent.modules, agent.hparams, agent.config
    k_pi, k_pair, k_drop = jax.random.split(key, 3)
    z_obs = agent.encode(params, obs)  # one pass: z_0 keeps its gradient, the targets do not
    next_z = jax.lax.stop_gradient(z_obs[1:])
    next_a = agent.act_prior(agent.policy.params, next_z, k_pi)[0]
    next_q = agent.q_value(agent.target_qs, next_z, next_a, k_pair, "min")
    td = jax.lax.stop_gradient(rewards + h["discount"] * (1.0 - terminals) * next_q)

    def rollout(z: jax.Array, a: jax.Array) -> tuple[jax.Array, jax.Array]:
        z = agent.next(params, z, a)
        return z, z

    _, pred_z = jax.lax.scan(rollout, z_obs[0], actions)
    zs = jnp.concatenate([z_obs[:1], pred_z])
    horizon = actions.shape[0]
    rho = h["rho"] ** jnp.arange(horizon) / horizon
    consistency = jnp.sum(rho * jnp.mean((pred_z - next_z) ** 2, axis=(1, 2)))
    za = jnp.concatenate([zs[:-1], actions], axis=-1)
    reward_ce = rl.soft_ce(m["reward"].apply(params["reward"], za), rewards, c.vmin, c.vmax)
    q_logits = m["qs"].apply(params["qs"], za, False, rngs={"dropout": k_drop})
    q_ce = rl.soft_ce(q_logits, jnp.broadcast_to(td, q_logits.shape[:-1]), c.vmin, c.vmax)
    reward_loss = jnp.sum(rho * reward_ce.mean(axis=1))
    value_loss = jnp.sum(rho * q_ce.mean(axis=(0, 2)))
    term_loss = jnp.zeros(())
    if c.episodic:
        logits = m["termination"].apply(params["termination"], zs[1:])[..., 0]
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
    """TD-MPC2's policy objective (Sec. 3): ``-sum_t rho^t (Q / S + entropy_coef * H_scaled)``.

    On the detached latents ``[H+1, B, L]``; Q is the mean of 2 random online Qs (dropout on,
    no gradient to them) divided by the running scale ``S`` of Q (5th-95th percentile range of
    the first step's Qs, at least 1, Polyak-averaged with ``tau``; updated here first); the
    weighted terms are averaged over the ``H+1`` steps, as the authors' code.
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
    def modules(self) -> dict[str, nn.Module]:
        """The (static) networks by name."""
        return make_modules(self.config, self.action_dim)

    def encode(self, params: Params, obs: jax.Array) -> jax.Array:
        """Latent state of observations ``[..., O]``."""
        return self.modules["encoder"].apply(params["encoder"], obs)

    def next(self, params: Params, z: jax.Array, a: jax.Array) -> jax.Array:
        """Next latent state."""
        za = jnp.concatenate([z, a], axis=-1)
        return self.modules["dynamics"].apply(params["dynamics"], za)

    def act_prior(self, policy_params: Params, z: jax.Array, key: jax.Array) -> tuple:
        """``squashed_policy`` of the policy prior at latents ``z``."""
        out = self.modules["policy"].apply(policy_params, z)
        return squashed_policy(out, key, self.config.log_std_min, self.config.log_std_max)

    def q_value(self, qs_params, z, a, key, reduce: str, dropout_key=None) -> jax.Array:
        """Minimum ('min') or mean ('avg') of 2 random members' decoded Q-values."""
        za = jnp.concatenate([z, a], axis=-1)
        rngs = {} if dropout_key is None else {"dropout": dropout_key}
        logits = self.modules["qs"].apply(qs_params, za, dropout_key is None, rngs=rngs)
        pair = jax.random.choice(key, self.config.sizes.num_q, (2,), replace=False)
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
        loss_grad = jax.grad(world_model_loss, has_aux=True)
        grads, (info, zs) = loss_grad(self.model.params, self, seq, k_model)
        agent = self.replace(rng=rng, model=self.model.apply_gradients(grads=grads))
        zs = jax.lax.stop_gradient(zs)
        policy, pi_info = nets.gradient_step(agent.policy, policy_loss, agent, zs, k_policy)
        target = rl.polyak_update(agent.model.params["qs"], agent.target_qs, self.hparams["tau"])
        agent = agent.replace(policy=policy, target_qs=target, q_scale=pi_info["policy/q_scale"])
        return agent, {**info, "model/grad_norm": optax.tree.norm(grads), **pi_info}

    # -------------------------------------------------------------------------------- acting

    def init_plan(self, num_envs: int) -> planners.PlanState:
        """Zero warm starts ``[num_envs, H, A]``."""
        return planners.init_plan(self.config.planner_config(), self.action_dim, (num_envs,))

    def _act_one(self, plan, obs, first, key, explore: bool):
        """One env: encode, MPPI over the latent model (or the policy prior alone), act."""
        k_pi, k_plan, k_noise = jax.random.split(key, 3)
        c = self.config
        z = self.encode(self.model.params, obs)
        if not c.mpc:
            action, mean = self.act_prior(self.policy.params, z, k_pi)[:2]
            return (action if explore else mean), plan
        pi_actions = prior_actions(self, z, k_pi) if c.sizes.num_pi_trajs > 0 else None
        value_fn = functools.partial(plan_value, self, z)
        planner = c.planner_config(self.action_dim)
        result, plan = planners.plan(planner, value_fn, plan, first, k_plan, pi_actions)
        action = result.actions[0]
        if explore:
            action = action + result.std[0] * jax.random.normal(k_noise, action.shape)
        return jnp.clip(action, -1.0, 1.0), plan

    def plan_actions(self, plan, obs, first, key, explore: bool):
        """Plan for ``obs [n, O]``, ``first [n]`` (no warm start there); actions ``[n, A]``.

        ``explore`` (static) adds ``std[0]`` Gaussian noise to the first planned action.
        """
        act = functools.partial(self._act_one, explore=explore)
        keys = jax.random.split(key, obs.shape[0])
        return jax.vmap(act)(plan, obs, jnp.asarray(first, bool), keys)

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Exploration actions for ``obs [n, O]`` from a fresh plan (no warm start)."""
        first = jnp.ones(obs.shape[0], bool)
        return self.plan_actions(self.init_plan(obs.shape[0]), obs, first, rng, True)[0]

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Planned actions without exploration noise, from a fresh plan and a fixed key."""
        first, key = jnp.ones(obs.shape[0], bool), jax.random.key(0)
        return self.plan_actions(self.init_plan(obs.shape[0]), obs, first, key, False)[0]

    @classmethod
    def create(
        cls, config: TDMPC2Config, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> TDMPC2:
        """Initialize from one observation ``[O]`` and action ``[A]``; ``seed`` may be traced."""
        if obs_example.ndim != 1:
            raise ValueError(f"TDMPC2 takes state observations [obs_dim], got {obs_example.shape}.")
        if config.discount is None:  # no env known: the authors' value for 1000-step episodes
            config = dataclasses.replace(config, discount=heuristic_discount(1000))
        action_dim, latent_dim = int(action_example.shape[-1]), config.sizes.latent_dim
        m, c = make_modules(config, action_dim), config
        rng, *keys = jax.random.split(jax.random.key(seed), 7)
        z, za = jnp.zeros((1, latent_dim)), jnp.zeros((1, latent_dim + action_dim))
        params = {
            "encoder": m["encoder"].init(keys[0], obs_example[None]),
            "dynamics": m["dynamics"].init(keys[1], za),
            "reward": m["reward"].init(keys[2], za),
            "qs": m["qs"].init(keys[3], za, True),
        }
        if c.episodic:
            params["termination"] = m["termination"].init(keys[4], z)
        adam_tx = optax.inject_hyperparams(adam, static_args=("max_grad_norm", "eps"))
        model_tx = adam_tx(c.lr, c.enc_lr_scale, c.grad_clip_norm)
        pi_tx = adam_tx(c.lr, 1.0, c.grad_clip_norm, eps=1e-5)  # the authors' policy Adam eps
        model = TrainState.create(apply_fn=None, params=params, tx=model_tx)
        policy = TrainState.create(apply_fn=None, params=m["policy"].init(keys[5], z), tx=pi_tx)
        hparams = nets.hparam_leaves(config, *HPARAMS)
        target = jax.tree.map(jnp.copy, params["qs"])
        return cls(rng, model, policy, target, jnp.ones(()), hparams, action_dim, config)


HPARAMS = ("discount", "tau", "rho", "consistency_coef", "reward_coef", "value_coef",
           "termination_coef", "entropy_coef")  # fmt: skip
"""Config floats held as pytree leaves in ``TDMPC2.hparams`` (sweepable without recompiling)."""


# ------------------------------------------------------------------------------------------ config


@dataclasses.dataclass(frozen=True, kw_only=True)
class TDMPC2Config(OffPolicyFields):
    """TD-MPC2 hyperparameters: the authors' ``config.yaml`` defaults (``model_size`` 5).

    As theirs: ``discount`` unset (None) is their heuristic of the env's episode length
    (``heuristic_discount``: 0.995 for 1000 steps, 0.975 for 200) and ``learning_starts`` their
    ``seed_steps``, both set wherever a run knows the env (``AgentSpec.with_env_defaults``);
    ``model_size`` picks their widths (``MODEL_SIZES``); an env that can terminate needs
    ``episodic`` (``jaxrl.envs.can_terminate``; they stop at the first termination, this
    refuses the run at setup). Differences: an explicit discount, width or count wins over the
    heuristic and the size (theirs overwrites the fields with the size's); ``model_size="cpu"``
    is this library's and also shrinks the MPPI budget; ``create`` without an env takes the
    1000-step discount; their Gymnasium-MuJoCo caps (discount 0.99, ``rho`` 0.7) are not
    applied; batches are ``[B, horizon, ...]`` sequences; single task only; the pretraining
    burst is the loop's; NaN plan values rank last (``jaxrl.planners``), not as 0.
    """

    discount: float | None = None
    """Discount factor; None: the authors' heuristic of the env's episode length."""
    tau: float = 0.01
    learning_starts: int = 5_000  # seed_steps(1000)

    model_size: Literal[1, 5, 19, 48, 317, "cpu"] = 5
    """Parameters in millions as the authors name them, or cpu (~0.07M, small MPPI budget): sets
    enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q, num_samples, num_elites, num_pi_trajs
    and iterations where those are not given."""
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
    """Learn a termination head and stop planned returns at predicted terminations (required
    on envs that can terminate, e.g. Hopper)."""
    latent_dim: int | None = None
    """Width of the latent state (a multiple of simnorm_dim); None: model_size's."""
    mlp_dim: int | None = None
    """Hidden width of dynamics, reward, termination, policy and Q networks (2 layers each);
    None: model_size's."""
    enc_dim: int | None = None
    """Hidden width of the encoder; None: model_size's."""
    num_enc_layers: int | None = None
    """Encoder layers (hidden layers = max(num_enc_layers - 1, 1)); None: model_size's."""
    num_q: int | None = None
    """Q-functions in the ensemble (at least 2); None: model_size's."""
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
    iterations: int | None = None
    """MPPI iterations (+2 when the action has 20 or more dimensions); None: model_size's."""
    num_samples: int | None = None
    """Action sequences per MPPI iteration, policy trajectories included; None: model_size's."""
    num_elites: int | None = None
    """Elite sequences that refit the MPPI distribution; None: model_size's."""
    num_pi_trajs: int | None = None
    """Sequences from rolling the policy prior through the model, per iteration; None:
    model_size's."""
    min_std: float = 0.05
    """Lower clip of the MPPI standard deviation."""
    max_std: float = 2.0
    """Initial MPPI standard deviation and its upper clip."""
    temperature: float = 0.5
    """Inverse temperature of the MPPI weights exp(temperature * (V - max V))."""

    @property
    def sizes(self) -> Sizes:
        """The widths and counts in use: the fields given, the rest from ``model_size``."""
        return _sizes(self)

    def planner_config(self, action_dim: int = 1) -> planners.PlannerConfig:
        """The MPPI settings for an action of ``action_dim`` dimensions."""
        d, same = self.sizes, ("horizon", "temperature", "min_std", "max_std")
        return planners.PlannerConfig(
            **{name: getattr(self, name) for name in same},
            num_samples=d.num_samples,
            num_elites=d.num_elites,
            iterations=d.iterations + 2 * int(action_dim >= 20),
            num_policy_samples=d.num_pi_trajs,
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        sized = [n for n in Sizes._fields if getattr(self, n) is not None and n != "num_pi_trajs"]
        check_positive(self, "lr", "enc_lr_scale", "grad_clip_norm", "simnorm_dim", "horizon")
        check_positive(self, "temperature", "max_std", *sized)
        check_range(self, "rho", 0.0, 1.0, low_open=True)
        check_range(self, "dropout", 0.0, 0.99)
        for name in ("consistency_coef", "reward_coef", "value_coef", "termination_coef"):
            check_range(self, name, 0.0, float("inf"))
        check_range(self, "entropy_coef", 0.0, float("inf"))
        problems = config_problems(self)
        if problems:
            raise ConfigError(f"TDMPC2Config: {problems[0]}; set the flags accordingly.")
        self.planner_config()  # the planner's own checks: elites <= samples, min_std <= max_std
