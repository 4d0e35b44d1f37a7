"""PETS: probabilistic ensembles with trajectory sampling, planning with CEM.

Chua et al., 2018, "Deep Reinforcement Learning in a Handful of Trials using Probabilistic
Dynamics Models" (arXiv:1805.12114), with the defaults of mbrl-lib's PETS. A probabilistic
ensemble (each member a Gaussian MLP over the normalized ``[obs, action]``) predicts the
observation delta and, unless a known reward function is named, the reward. Actions come from
CEM over action sequences (``jaxrl.planners``) whose value is the mean, over trajectory-sampled
particles, of the summed predicted rewards. The ensemble is refit on the whole replay buffer
every ``model_train_freq`` env steps (``PETS.update``, driven by the loops through the
registry's ``refit_field``). The state (ensemble, optimizer, input normalizer, elite scores) is
one frozen pytree, so ``update`` jits and vmaps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import planners
from jaxrl.agents.pets_model import (
    GaussianMLP,
    alive_returns,
    bound_logvar,
    buffer_stats,
    fit_with_early_stopping,
    inverted_pendulum_termination,
    member_mse,
    model_loss,
    normalize_inputs,
    pendulum_reward,
    shuffled_prefix,
)
from jaxrl.buffers import BufferState
from jaxrl.config import ConfigError, OffPolicyFields, check_choice, check_positive, check_range
from jaxrl.normalization import RunningStats, running_stats_init
from jaxrl.types import InfoDict, Params, Transition

# ------------------------------------------------------------------ known rewards and terminations
REWARD_FNS: dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array]] = {
    "pendulum": pendulum_reward,
}
"""Known rewards ``r(obs, action, next_obs)`` on raw observations and actions in [-1, 1]."""

TERMINATION_FNS: dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array]] = {
    "inverted_pendulum": inverted_pendulum_termination,
}
"""Known terminations ``done(obs, action, next_obs)`` (bool) on raw observations (mbrl-lib's)."""

# -------------------------------------------------------------------------------------- the agent


class PETS(struct.PyTreeNode):
    """PETS state: ensemble and optimizer, input normalizer, elite scores, RNG."""

    rng: jax.Array
    model: TrainState
    in_stats: RunningStats
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

    def model_data(self, rows: Transition) -> tuple[jax.Array, jax.Array]:
        """Normalized inputs ``[obs, action]`` and raw targets (delta obs, reward) of ``rows``."""
        x = normalize_inputs(self.in_stats, jnp.concatenate([rows.obs, rows.action], axis=-1))
        y = rows.next_obs - rows.obs
        if self.config.reward_fn == "learned":
            y = jnp.concatenate([y, rows.reward[..., None]], axis=-1)
        return x, y

    def update(self, buffer: BufferState) -> tuple[PETS, InfoDict]:
        """Refit the ensemble on the replay buffer's stored rows, as mbrl-lib's PETS.

        The loops call it every ``model_train_freq`` env steps; the steps are in
        ``PETSConfig``'s docstring. Elites: the members with the lowest best held-out MSE.
        """
        cfg, e, b = self.config, self.config.ensemble_size, self.config.batch_size
        data, size, capacity = buffer.data, buffer.size, buffer.capacity
        rng, k_split, k_boot, k_epochs = jax.random.split(self.rng, 4)
        x_all = jnp.concatenate([data.obs, data.action], axis=-1)
        agent = self.replace(rng=rng, in_stats=buffer_stats(x_all, size))
        rows = shuffled_prefix(k_split, capacity, size)  # rows[:size]: the stored rows, shuffled
        n_val = jnp.floor(size * cfg.validation_ratio).astype(jnp.int32)
        n_train = size - n_val
        held_out = n_val > 0
        scored = (rows, jnp.where(held_out, n_train, 0), jnp.where(held_out, n_val, n_train))
        # Member m's j-th training row is rows[boot[m, j]], j < n_train (drawn with replacement).
        boot = jax.random.randint(k_boot, (e, capacity), 0, n_train)
        n_batches = -(-n_train // b)

        def train_batch(k: jax.Array, carry: tuple) -> tuple:
            model, order, loss = carry
            j = k * b + jnp.arange(b)
            pos = order[jnp.minimum(j, capacity - 1)]
            x, y = agent.model_data(jax.tree.map(lambda d: d[rows[boot[:, pos]]], data))
            model, info = nets.gradient_step(model, model_loss, agent, x, y, j < n_train)
            return model, order, loss + info["model/nll"]

        def train_epoch(model: TrainState, key: jax.Array) -> tuple[TrainState, jax.Array]:
            init = (model, shuffled_prefix(key, capacity, n_train), jnp.float32(0))
            model, _, loss = jax.lax.fori_loop(0, n_batches, train_batch, init)
            return model, loss / jnp.maximum(n_batches, 1)

        def score(params: Params) -> jax.Array:
            return member_mse(agent, params, data, scored)

        start = score(self.model.params)
        model, best, epochs, loss = fit_with_early_stopping(
            self.model,
            train_epoch,
            score,
            start,
            k_epochs,
            max_epochs=cfg.model_epochs,
            patience=cfg.patience,
            threshold=cfg.improvement_threshold,
        )
        agent = agent.replace(model=model, elite_score=best)
        info = {
            "model/nll": loss,
            "model/mse": best.mean(),
            "model/mse_before": start.mean(),
            "model/elite_mse": jnp.sort(best)[: cfg.num_elites].mean(),
            "model/epochs": epochs,
            "model/train_rows": n_train,
            "model/val_rows": n_val,
        }
        return agent, info

    # ---------------------------------------------------------------------------------- acting

    def trajectory_returns(self, obs: jax.Array, actions: jax.Array, key: jax.Array) -> jax.Array:
        """Mean over particles of the summed rewards (``alive_returns``) of ``actions [N, H, A]``.

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
            x = normalize_inputs(self.in_stats, jnp.concatenate([states, act], axis=-1))
            mean, logvar = self.predict(params, x[order])
            sample = mean + jnp.exp(0.5 * logvar) * jax.random.normal(k_noise, mean.shape)
            y = jnp.zeros((n * p, mean.shape[-1])).at[order].set(sample)
            next_states = states + y[:, : self.obs_dim]
            if cfg.reward_fn == "learned":
                reward = y[:, -1]
            else:
                reward = REWARD_FNS[cfg.reward_fn](states, act, next_states)
            done = jnp.zeros(reward.shape, bool)  # 'none': as before, rollouts never end
            if cfg.termination_fn != "none":
                done = TERMINATION_FNS[cfg.termination_fn](states, act, next_states)
            return next_states, (reward, done)

        states = jnp.broadcast_to(obs, (n * p, obs.shape[-1]))
        keys = jax.random.split(key, actions.shape[1])
        _, (rewards, dones) = jax.lax.scan(step, states, (actions.swapaxes(0, 1), keys))
        return alive_returns(rewards, dones).reshape(n, p).mean(axis=1)

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
        stats = running_stats_init(x.shape[-1])
        return cls(rng, model, stats, score, obs_dim, action_dim, config)


# ------------------------------------------------------------------------------------------ config


@dataclasses.dataclass(frozen=True, kw_only=True)
class PETSConfig(OffPolicyFields):
    """PETS hyperparameters: mbrl-lib's (``pets.yaml``, ``gaussian_mlp_ensemble``, pets_hopper).

    Training follows mbrl-lib's PETS: every ``model_train_freq`` env steps (the first time
    after the ``learning_starts`` random steps, before the first planned action) the ensemble
    is refit on the whole replay buffer: the input normalizer is set to the mean/std of all
    stored ``[obs, action]`` rows (targets, the observation delta and reward, stay raw), a
    fresh random ``validation_ratio`` of the rows is held out, each member trains on its own
    bootstrap resample (with replacement) of the rest for up to ``model_epochs`` epochs of
    ``batch_size`` rows, with early stopping after ``patience`` epochs without a relative
    improvement of ``improvement_threshold`` in any member's held-out MSE; the best epoch's
    parameters are kept (the optimizer state carries over) and the elites are the members with
    the lowest held-out MSE. Differences on purpose: ``validation_ratio`` defaults to 0.05
    (pets_reacher; pets_hopper holds out nothing and ranks on the training rows, as 0 does
    here) so that the elites are chosen on held-out data; ``utd_ratio`` is unused; the
    normalizer's variance is the population one (mbrl-lib: n - 1); each epoch sorts
    ``buffer_size`` random keys (size the buffer to the run, as mbrl-lib does: ~0.6 s per epoch
    at 10^6 rows on this CPU). CEM (``jaxrl.planners``) samples mbrl-lib's bound-capped
    truncated normal and smooths the unbiased elite variance, as mbrl-lib. Rollouts end only at
    a known ``termination_fn``'s first predicted termination (rewards count up to and including
    it; this follows mbrl-lib's ``termination_fns`` and ``ModelEnv``), the planned return is
    undiscounted (``discount`` and ``tau`` are unused) and known reward / termination functions
    read raw observations (do not combine them with env observation normalization). Cost at the
    defaults: 500 x 20 particles x 15 steps x 5 iterations of a 4x200 MLP, ~180 GFLOP per step.
    The tests' CPU config (``PETS_CPU``, tests/test_pets.py): 4 members of 64x64, CEM 64 x 3, a
    refit every 25 steps (pets_cartpole: 50) at its rate and epochs, batch 64, 10% held out.
    """

    learning_starts: int = 1_000  # mbrl-lib: one episode (trial_length) of random actions
    batch_size: int = 32
    """Rows per gradient step of a refit (mbrl-lib model_batch_size)."""

    ensemble_size: int = 7
    """Members of the probabilistic ensemble."""
    num_elites: int = 5
    """Members with the lowest held-out MSE at the last refit that the planner's particles use."""
    hidden_dims: tuple[int, ...] = (200, 200, 200, 200)
    """Hidden layer widths of each member (SiLU)."""
    model_lr: float = 2e-4
    """Adam learning rate of the ensemble (mbrl-lib model_lr)."""
    model_weight_decay: float = 3e-5
    """L2 weight decay added to the ensemble's gradient (torch Adam's weight_decay; model_wd)."""
    learn_logvar_bounds: bool = False
    """Learn the log-variance bounds (init -10 and 0.5) instead of keeping them fixed."""
    model_train_freq: int = 250
    """Env steps between refits of the ensemble on the whole buffer (mbrl-lib freq_train_model)."""
    model_epochs: int = 25
    """Most epochs over the training rows per refit (mbrl-lib num_epochs_train_model)."""
    patience: int = 25
    """Stop a refit after this many epochs without a held-out improvement; 0: never."""
    improvement_threshold: float = 0.01
    """Relative decrease of a member's held-out MSE that counts as an improvement."""
    validation_ratio: float = 0.05
    """Fraction (at most 0.5) of the stored rows held out at each refit: early stop, elites."""
    reward_fn: str = "learned"
    """'learned' (a reward head) or a known reward function: 'pendulum'."""
    termination_fn: str = "none"
    """'none' (rollouts never end) or a known termination function: 'inverted_pendulum'."""
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
    """Initial CEM std, (high - low) / 4 as mbrl-lib (CEM caps the variance by the bounds)."""
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
        check_positive(self, "model_train_freq", "model_epochs")
        check_range(self, "patience", 0, float("inf"))
        check_range(self, "improvement_threshold", 0.0, float("inf"))
        check_range(self, "validation_ratio", 0.0, 0.5)
        check_choice(self, "reward_fn", ("learned", *REWARD_FNS))
        check_choice(self, "termination_fn", ("none", *TERMINATION_FNS))
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
