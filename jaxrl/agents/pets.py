"""PETS: probabilistic ensembles with trajectory sampling, planning with CEM.

Chua et al., 2018, "Deep Reinforcement Learning in a Handful of Trials using Probabilistic
Dynamics Models" (arXiv:1805.12114), with the defaults of mbrl-lib's PETS. A probabilistic
ensemble (each member a Gaussian MLP over the normalized ``[obs, action]``) predicts the
observation delta and, unless a known reward function is named, the reward. Actions come from
CEM over action sequences (``jaxrl.planners``) whose value is the mean, over trajectory-sampled
particles, of the summed predicted rewards. The state (ensemble, optimizer, normalizers, elite
scores) is one frozen pytree, so ``update`` scans, jits and vmaps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import planners
from jaxrl.config import ConfigError, OffPolicyFields, check_choice, check_positive, check_range
from jaxrl.normalization import RunningStats, running_stats_init, running_stats_update
from jaxrl.types import Batch, InfoDict, Params

# ------------------------------------------------------------------------------ known rewards


def pendulum_reward(obs: jax.Array, action: jax.Array, next_obs: jax.Array) -> jax.Array:
    """Pendulum-v1 / ``jax:pendulum`` reward from obs ``(cos th, sin th, thdot)``, torque 2a.

    ``-(th^2 + 0.1 thdot^2 + 0.001 u^2)`` of the state *before* the step, ``th`` in [-pi, pi].
    """
    del next_obs
    th = jnp.arctan2(obs[..., 1], obs[..., 0])
    u = 2.0 * jnp.clip(action[..., 0], -1.0, 1.0)
    return -(th**2 + 0.1 * obs[..., 2] ** 2 + 0.001 * u**2)


REWARD_FNS: dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array]] = {
    "pendulum": pendulum_reward,
}
"""Known rewards ``r(obs, action, next_obs)`` on raw observations and actions in [-1, 1]."""

# ------------------------------------------------------------------------------------ the model


def _trunc_normal_init(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
    # mbrl-lib's `truncated_normal_init`: N(0, 1 / (4 fan_in)) truncated at 2 std.
    std = 1.0 / (2.0 * jnp.sqrt(shape[0]))
    return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


class GaussianMLP(nn.Module):
    """One ensemble member: SiLU MLP emitting ``(mean, raw log-variance)``, each ``[..., out]``."""

    out_dim: int
    hidden_dims: Sequence[int] = (200, 200, 200, 200)

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Mean and unbounded log-variance of the target given the normalized input ``x``."""
        dims = (*self.hidden_dims, 2 * self.out_dim)
        out = nets.MLP(dims, nn.silu, kernel_init=_trunc_normal_init)(x)
        return out[..., : self.out_dim], out[..., self.out_dim :]


def bound_logvar(raw: jax.Array, min_logvar: jax.Array, max_logvar: jax.Array) -> jax.Array:
    """Softly bound a log-variance into ``(min_logvar, max_logvar)`` (PETS appendix A.1).

    ``max - softplus(max - raw)`` then ``min + softplus(. - min)``, as mbrl-lib's ``GaussianMLP``.
    """
    logvar = max_logvar - jax.nn.softplus(max_logvar - raw)
    return min_logvar + jax.nn.softplus(logvar - min_logvar)


def gaussian_nll(mean: jax.Array, logvar: jax.Array, target: jax.Array) -> jax.Array:
    """Elementwise Gaussian NLL without the constant and the 1/2: ``(mu - y)^2 e^-lv + lv``."""
    return (mean - target) ** 2 * jnp.exp(-logvar) + logvar


def _normalize(stats: RunningStats, x: jax.Array) -> jax.Array:
    # mbrl-lib's Normalizer: a (near-)constant dimension is only centered (std < 1e-5 -> 1).
    std = jnp.sqrt(stats.var)
    return (x - stats.mean) / jnp.where(std < 1e-5, 1.0, std)


def _denormalize(stats: RunningStats, y: jax.Array) -> jax.Array:
    std = jnp.sqrt(stats.var)
    return y * jnp.where(std < 1e-5, 1.0, std) + stats.mean


# ----------------------------------------------------------------------------------------- losses


def model_loss(
    params: Params, agent: PETS, x: jax.Array, y: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Ensemble NLL with the log-variance bound regularizer (PETS eq. 2 and appendix A.1).

    ``x [E, B, in]``, ``y [E, B, out]``: each member's own (bootstrap) rows. The NLL is averaged
    over rows and dimensions and summed over members, plus ``0.01 (sum max_lv - sum min_lv)``.
    """
    mean, logvar = agent.predict(params, x)
    nll = gaussian_nll(mean, logvar, y).mean(axis=(1, 2)).sum()
    reg = 0.01 * (params["max_logvar"].sum() - params["min_logvar"].sum())
    if not agent.config.learn_logvar_bounds:
        reg = jax.lax.stop_gradient(reg)  # fixed bounds: a constant, as in mbrl-lib
    mse = ((mean - y) ** 2).mean(axis=(1, 2))
    info = {"model/nll": nll, "model/mse": mse.mean(), "model/logvar": logvar.mean()}
    return nll + reg, {**info, "model/member_mse": mse}


# -------------------------------------------------------------------------------------- the agent


class PETS(struct.PyTreeNode):
    """PETS state: ensemble and optimizer, input/target normalizers, elite scores, RNG."""

    rng: jax.Array
    model: TrainState
    in_stats: RunningStats
    out_stats: RunningStats
    elite_score: jax.Array
    obs_dim: int = struct.field(pytree_node=False)
    action_dim: int = struct.field(pytree_node=False)
    config: PETSConfig = struct.field(pytree_node=False)

    def predict(self, params: Params, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per-member ``(mean, bounded log-variance)`` of ``x [M, B, in]``, M members of params."""
        mean, raw = jax.vmap(self.model.apply_fn)(params["members"], x)
        lo, hi = params["min_logvar"], params["max_logvar"]
        if not self.config.learn_logvar_bounds:
            lo, hi = jax.lax.stop_gradient(lo), jax.lax.stop_gradient(hi)
        return mean, bound_logvar(raw, lo, hi)

    def update(self, batch: Batch) -> tuple[PETS, InfoDict]:
        """One NLL step of every member on its bootstrap resample of ``batch`` (rows ``[B, ...]``).

        The normalizers first absorb the batch; each member's score is an EMA of its MSE on its
        rows, measured in the same forward pass (before the step); the elites have the lowest.
        """
        cfg, e = self.config, self.config.ensemble_size
        rng, key = jax.random.split(self.rng)
        x_raw = jnp.concatenate([batch.obs, batch.action], axis=-1)
        y_raw = batch.next_obs - batch.obs
        if cfg.reward_fn == "learned":
            y_raw = jnp.concatenate([y_raw, batch.reward[:, None]], axis=-1)
        in_stats = running_stats_update(self.in_stats, x_raw)
        out_stats = self.out_stats
        if cfg.normalize_targets:
            out_stats = running_stats_update(out_stats, y_raw)
        x, y = _normalize(in_stats, x_raw), _normalize(out_stats, y_raw)
        rows = jax.random.randint(key, (e, x.shape[0]), 0, x.shape[0])
        agent = self.replace(in_stats=in_stats, out_stats=out_stats)
        model, info = nets.gradient_step(self.model, model_loss, agent, x[rows], y[rows])
        mse = info.pop("model/member_mse")
        score = (1.0 - cfg.elite_ema) * self.elite_score + cfg.elite_ema * mse
        elite_mse = jnp.sort(score)[: cfg.num_elites].mean()
        info = {**info, "model/elite_score": elite_mse}
        return agent.replace(rng=rng, model=model, elite_score=score), info

    # ---------------------------------------------------------------------------------- acting

    def trajectory_returns(self, obs: jax.Array, actions: jax.Array, key: jax.Array) -> jax.Array:
        """Mean over particles of the summed rewards of ``actions [N, H, A]`` from ``obs``.

        Each sequence is rolled out by ``num_particles`` particles split evenly over the elites;
        the next state is sampled from the member's Gaussian. 'fixed_model' keeps a particle on
        its member for the whole horizon (TS-inf); 'random_model' reassigns every step (TS1).
        """
        cfg = self.config
        n, p = actions.shape[0], cfg.num_particles
        elites = jax.lax.top_k(-self.elite_score, cfg.num_elites)[1]
        params = {**self.model.params}
        params["members"] = jax.tree.map(lambda w: w[elites], params["members"])
        # Row n * P + j belongs to member j // (P / elites): a balanced, fixed assignment.
        fixed = jnp.arange(n * p).reshape(n, cfg.num_elites, -1).swapaxes(0, 1)
        fixed = fixed.reshape(cfg.num_elites, -1)

        def step(states: jax.Array, inputs: tuple[jax.Array, jax.Array]):
            act, key = inputs
            k_perm, k_noise = jax.random.split(key)
            act = jnp.repeat(act, p, axis=0)
            if cfg.propagation == "fixed_model":
                order = fixed
            else:
                order = jax.random.permutation(k_perm, n * p).reshape(cfg.num_elites, -1)
            x = _normalize(self.in_stats, jnp.concatenate([states, act], axis=-1))
            mean, logvar = self.predict(params, x[order])
            sample = mean + jnp.exp(0.5 * logvar) * jax.random.normal(k_noise, mean.shape)
            y = jnp.zeros((n * p, mean.shape[-1])).at[order].set(sample)
            y = _denormalize(self.out_stats, y)
            next_states = states + y[:, : self.obs_dim]
            if cfg.reward_fn == "learned":
                reward = y[:, -1]
            else:
                reward = REWARD_FNS[cfg.reward_fn](states, act, next_states)
            return next_states, reward

        states = jnp.broadcast_to(obs, (n * p, obs.shape[-1]))
        keys = jax.random.split(key, actions.shape[1])
        _, rewards = jax.lax.scan(step, states, (actions.swapaxes(0, 1), keys))
        return rewards.sum(axis=0).reshape(n, p).mean(axis=1)

    def init_plan(self, num_envs: int) -> planners.PlanState:
        """A fresh plan carry for ``num_envs`` environments (zeros: mbrl-lib's initial mean)."""
        return planners.init_plan(self.config.planner_config(), self.action_dim, (num_envs,))

    def plan_actions(
        self,
        plan: planners.PlanState,
        obs: jax.Array,
        first: jax.Array,
        key: jax.Array,
        explore: bool,
    ) -> tuple[jax.Array, planners.PlanState]:
        """CEM per env (``obs [n, obs_dim]``, ``first [n]``); acts with the final mean's first step.

        ``explore`` changes nothing: PETS explores only through CEM's sampling and the model's
        stochastic rollouts (mbrl-lib adds no action noise), training and evaluation alike.
        """
        del explore
        pcfg = self.config.planner_config()

        def one(plan: planners.PlanState, obs: jax.Array, first: jax.Array, key: jax.Array):
            value_fn = partial(self.trajectory_returns, obs)
            result, plan = planners.plan(pcfg, value_fn, plan, first, key)
            return result.mean[0], plan

        keys = jax.random.split(key, obs.shape[0])
        return jax.vmap(one)(plan, obs, first, keys)

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Actions in [-1, 1] planned from scratch (no warm start) for ``obs [(n,) obs_dim]``."""
        batch = obs if obs.ndim == 2 else obs[None]
        first = jnp.ones(batch.shape[0], bool)
        actions = self.plan_actions(self.init_plan(batch.shape[0]), batch, first, rng, True)[0]
        return actions if obs.ndim == 2 else actions[0]

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """As ``sample_actions`` with a fixed key (deterministic given the agent and ``obs``)."""
        return self.sample_actions(obs, jax.random.key(0))

    @classmethod
    def create(
        cls, config: PETSConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> PETS:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        obs_dim, action_dim = obs_example.shape[-1], action_example.shape[-1]
        out_dim = obs_dim + (config.reward_fn == "learned")
        rng, key = jax.random.split(jax.random.key(seed))
        member = GaussianMLP(out_dim, config.hidden_dims)
        x = jnp.zeros((1, obs_dim + action_dim), jnp.float32)
        keys = jax.random.split(key, config.ensemble_size)
        params = {
            "members": jax.vmap(member.init, in_axes=(0, None))(keys, x),
            "min_logvar": jnp.full((out_dim,), -10.0, jnp.float32),
            "max_logvar": jnp.full((out_dim,), 0.5, jnp.float32),
        }
        learn = config.learn_logvar_bounds

        def mask(p: Params) -> Params:
            members = jax.tree.map(lambda _: True, p["members"])
            return {"members": members, "min_logvar": learn, "max_logvar": learn}

        def adam_l2(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
            # torch Adam's weight_decay (mbrl-lib): L2 added to the gradient, not AdamW.
            decay = optax.add_decayed_weights(weight_decay, mask)
            return optax.chain(decay, optax.adam(learning_rate))

        tx = optax.inject_hyperparams(adam_l2)(
            learning_rate=config.model_lr, weight_decay=config.model_weight_decay
        )
        model = TrainState.create(apply_fn=member.apply, params=params, tx=tx)
        score = jnp.zeros(config.ensemble_size, jnp.float32)
        stats_in, stats_out = running_stats_init(x.shape[-1]), running_stats_init(out_dim)
        return cls(rng, model, stats_in, stats_out, score, obs_dim, action_dim, config)


# ------------------------------------------------------------------------------------------ config


@dataclasses.dataclass(frozen=True, kw_only=True)
class PETSConfig(OffPolicyFields):
    """PETS hyperparameters; mbrl-lib's PETS defaults (``pets.yaml``, ``gaussian_mlp_ensemble``).

    Training differs from mbrl-lib's (which refits the ensemble every ``freq_train_model`` steps
    for up to ``num_epochs_train_model`` epochs with early stopping on a validation split):
    here the ensemble trains online on the shared replay buffer, ``utd_ratio`` minibatch steps
    per env step, each member on its own bootstrap resample of the minibatch; the input (and
    target) normalizers are running statistics of the minibatches; the elites are the members
    with the lowest EMA of the MSE measured on their rows before each step (mbrl-lib: the
    validation MSE). CEM (``jaxrl.planners``) clips its Gaussian samples to [-1, 1] and smooths
    the std (mbrl-lib: truncated samples inside the bounds, smoothing of the variance). Rollouts
    never terminate (the PETS envs here have no termination), the planned return is undiscounted
    (``discount`` and ``tau`` are unused) and a known ``reward_fn`` reads raw observations (do
    not combine it with env observation normalization). Cost at the defaults: 500 sequences x
    20 particles x 15 steps x 5 iterations of a 4x200 MLP, ~180 GFLOP per env and env step.
    """

    learning_starts: int = 1_000  # mbrl-lib: one episode (trial_length) of random actions

    ensemble_size: int = 7
    """Members of the probabilistic ensemble."""
    num_elites: int = 5
    """Members with the lowest running MSE that the planner's particles use."""
    hidden_dims: tuple[int, ...] = (200, 200, 200, 200)
    """Hidden layer widths of each member (SiLU)."""
    model_lr: float = 7.5e-4
    """Adam learning rate of the ensemble (mbrl-lib pets_cartpole)."""
    model_weight_decay: float = 3e-5
    """L2 weight decay added to the ensemble's gradient (torch Adam's weight_decay)."""
    learn_logvar_bounds: bool = False
    """Learn the log-variance bounds (init -10 and 0.5) instead of keeping them fixed."""
    normalize_targets: bool = True
    """Standardize the delta/reward targets with running statistics (mbrl-lib: raw targets)."""
    elite_ema: float = 0.01
    """EMA rate of each member's MSE score that ranks the elites."""
    reward_fn: str = "learned"
    """'learned' (a reward head) or a known reward function: 'pendulum'."""
    horizon: int = 15
    """Planning horizon of CEM."""
    method: Literal["cem", "mppi"] = "cem"
    """Planner over the particles: 'cem' (mbrl-lib's; uniform elites) or 'mppi' (elites weighted
    by exp(temperature * (V - max V))); the cem_* fields below size either."""
    temperature: float = 1.0
    """Inverse temperature of 'mppi' on the planned (undiscounted) returns."""
    population: int = 500
    """Action sequences sampled per CEM iteration."""
    cem_elites: int = 50
    """Best sequences that refit the CEM distribution (elite ratio 0.1)."""
    cem_iterations: int = 5
    """CEM iterations per env step."""
    cem_momentum: float = 0.1
    """CEM smoothing (mbrl-lib alpha): new = momentum * old + (1 - momentum) * elite fit."""
    cem_init_std: float = 0.5
    """Initial CEM std, (high - low) / 4 as mbrl-lib, and its upper clip."""
    cem_min_std: float = 0.0
    """Lower clip of the CEM std (mbrl-lib: none)."""
    num_particles: int = 20
    """Particles per action sequence; a multiple of num_elites (split evenly over them)."""
    propagation: Literal["fixed_model", "random_model"] = "fixed_model"
    """Particle-to-member assignment: 'fixed_model' (TS-inf) or 'random_model' (TS1, per step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "ensemble_size", "num_elites", "hidden_dims", "model_lr")
        check_positive(self, "num_particles", "horizon", "population", "cem_elites")
        check_positive(self, "cem_iterations", "cem_init_std")
        check_range(self, "model_weight_decay", 0.0, float("inf"))
        check_range(self, "elite_ema", 0.0, 1.0, low_open=True)
        check_choice(self, "reward_fn", ("learned", *REWARD_FNS))
        check_choice(self, "propagation", ("fixed_model", "random_model"))
        if self.num_elites > self.ensemble_size:
            raise ConfigError(
                f"PETSConfig.num_elites ({self.num_elites}) cannot exceed ensemble_size "
                f"({self.ensemble_size}); lower --num-elites or raise --ensemble-size."
            )
        if self.cem_elites > self.population:
            raise ConfigError(
                f"PETSConfig.cem_elites ({self.cem_elites}) cannot exceed population "
                f"({self.population}); lower --cem-elites or raise --population."
            )
        if self.num_particles % self.num_elites:
            raise ConfigError(
                f"PETSConfig.num_particles ({self.num_particles}) must be a multiple of "
                f"num_elites ({self.num_elites}) so that every elite rolls out as many particles; "
                "set --num-particles accordingly."
            )
        try:
            self.planner_config()
        except ConfigError as err:
            raise ConfigError(f"PETSConfig planner fields: {err}") from None

    def planner_config(self) -> planners.PlannerConfig:
        """The ``PlannerConfig`` (CEM or MPPI) these fields describe."""
        return planners.PlannerConfig(
            method=self.method,
            temperature=self.temperature,
            horizon=self.horizon,
            num_samples=self.population,
            num_elites=self.cem_elites,
            iterations=self.cem_iterations,
            min_std=self.cem_min_std,
            max_std=self.cem_init_std,
            momentum=self.cem_momentum,
        )
