"""Sampling-based planners over action sequences: MPPI and CEM, as pure functions.

Both methods search a horizon-``H`` sequence of actions that maximizes a user-supplied
``value_fn(actions [N, H, A], key) -> [N]`` (a learned world model's return estimate, or the true
simulator's rollout return). Each of ``iterations`` rounds samples a population around a diagonal
Gaussian ``(mean, std)``, keeps the ``num_elites`` best sequences and refits the Gaussian to them:

- ``"mppi"``: model-predictive path integral control (Williams et al., 2016, "Aggressive Driving
  with Model Predictive Path Integral Control"; Williams et al., 2017, "Information Theoretic MPC
  for Model-Based Reinforcement Learning") in the elite-restricted form of TD-MPC2 (Hansen et al.,
  2024, ``TDMPC2._plan`` in nicklashansen/tdmpc2 ``tdmpc2/tdmpc2.py``): the elites are weighted
  by ``softmax(temperature * (V - max V))`` (``temperature`` is the *inverse* temperature) and
  the new mean and std are the weighted mean and standard deviation of the elites;
- ``"cem"``: the cross-entropy method (Rubinstein, 1999; as used by PETS, Chua et al., 2018):
  uniform weights over the elites; ``momentum`` smooths the refit as mbrl-lib's ``CEMOptimizer``
  (``alpha``) does.

The standard deviation starts at ``max_std`` and is clipped to ``[min_std, max_std]`` after each
refit. The mean starts from the previous step's final mean shifted by one step (TD-MPC2's
``_prev_mean``; zeros at an episode's first step). The returned action sequence is one elite drawn
from the final weights (Gumbel-max, i.e. categorical sampling, as TD-MPC2 does), and
``PlanState`` — a pytree that checkpoints with the rest of a training state — carries the final
mean to the next step.

``plan`` handles one environment; ``jax.vmap`` it over environments and ``jax.jit`` the caller.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal, get_args

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.config import ConfigError, check_choice, check_positive, check_range

PlannerMethod = Literal["mppi", "cem"]
"""How the elites are weighted: 'mppi' (exponentiated values) or 'cem' (uniformly)."""

PLANNER_METHODS: tuple[str, ...] = get_args(PlannerMethod)
"""Accepted values of ``PlannerConfig.method``."""

ValueFn = Callable[[jax.Array, jax.Array], jax.Array]
"""``value_fn(actions [N, H, A], key) -> values [N]``; higher is better."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """Sampling-planner hyperparameters; defaults are TD-MPC2's (Hansen et al., 2024)."""

    method: PlannerMethod = "mppi"
    """Elite weighting: 'mppi' (softmax of temperature * value) or 'cem' (uniform)."""
    horizon: int = 3
    """Length H of the planned action sequences."""
    num_samples: int = 512
    """Population per iteration, policy samples included."""
    num_elites: int = 64
    """Best sequences per iteration that refit the sampling distribution."""
    iterations: int = 6
    """Sample-and-refit rounds per planning call."""
    temperature: float = 0.5
    """Inverse temperature of the MPPI weights exp(temperature * (V - max V)) over the elites."""
    min_std: float = 0.05
    """Lower clip of the sampling standard deviation."""
    max_std: float = 2.0
    """Initial sampling standard deviation and its upper clip."""
    num_policy_samples: int = 0
    """Sequences from a policy prior included in each population (TD-MPC2's num_pi_trajs)."""
    momentum: float = 0.0
    """Refit smoothing: new = momentum * old + (1 - momentum) * elite fit (mbrl-lib alpha)."""

    def __post_init__(self) -> None:
        check_choice(self, "method", PLANNER_METHODS)
        for name in ("horizon", "num_samples", "num_elites", "iterations", "num_policy_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"PlannerConfig.{name} must be an integer, got {value!r}; "
                    f"set --{name.replace('_', '-')} to an integer."
                )
        check_positive(self, "horizon", "num_samples", "num_elites", "iterations")
        check_positive(self, "temperature", "max_std")
        check_range(self, "num_policy_samples", 0, float("inf"))
        check_range(self, "min_std", 0.0, float("inf"))
        if self.num_elites > self.num_samples:
            raise ConfigError(
                f"PlannerConfig.num_elites ({self.num_elites}) must be <= num_samples "
                f"({self.num_samples}); lower --num-elites or raise --num-samples."
            )
        if self.num_policy_samples >= self.num_samples:
            raise ConfigError(
                f"PlannerConfig.num_policy_samples ({self.num_policy_samples}) must be < "
                f"num_samples ({self.num_samples}) so that some sequences are sampled around the "
                "mean; lower --num-policy-samples or raise --num-samples."
            )
        if self.min_std > self.max_std:
            raise ConfigError(
                f"PlannerConfig.min_std ({self.min_std}) must be <= max_std ({self.max_std}); "
                "set --min-std and --max-std accordingly."
            )
        if not (0.0 <= self.momentum < 1.0):
            raise ConfigError(
                f"PlannerConfig.momentum must be in [0, 1), got {self.momentum!r} (1 would never "
                "move the sampling distribution); set --momentum accordingly."
            )
        if not math.isfinite(self.temperature) or not math.isfinite(self.max_std):
            raise ConfigError(
                "PlannerConfig.temperature and max_std must be finite; "
                "set --temperature and --max-std to finite values."
            )


class PlanState(struct.PyTreeNode):
    """The carry between planning calls: the last call's final mean, ``[..., H, A]``."""

    mean: jax.Array


class PlanResult(struct.PyTreeNode):
    """What one planning call found (one environment).

    Attributes:
        actions: ``[H, A]`` an elite sequence drawn from the final weights; act with ``actions[0]``.
        mean: ``[H, A]`` the final mean of the sampling distribution.
        std: ``[H, A]`` the final standard deviation (clipped to ``[min_std, max_std]``).
        value: ``[]`` the best value of the final iteration's population.
    """

    actions: jax.Array
    mean: jax.Array
    std: jax.Array
    value: jax.Array


def init_plan(
    config: PlannerConfig, action_dim: int, batch_shape: tuple[int, ...] = ()
) -> PlanState:
    """A zero plan of shape ``batch_shape + (horizon, action_dim)`` (nothing to warm-start from).

    Args:
        config: the planner's configuration.
        action_dim: size ``A`` of the action vector.
        batch_shape: leading axes, e.g. ``(num_envs,)``; an int is taken as ``(int,)``.
    """
    if isinstance(batch_shape, int):
        batch_shape = (batch_shape,)
    shape = tuple(batch_shape) + (config.horizon, int(action_dim))
    return PlanState(mean=jnp.zeros(shape, jnp.float32))


def warm_start(plan: PlanState, first: jax.Array | bool) -> jax.Array:
    """The initial mean of a planning call: the previous final mean shifted one step ahead.

    Step ``t`` of the new mean is step ``t + 1`` of the old one and the last step is 0 (TD-MPC2's
    ``mean[:-1] = _prev_mean[1:]``). Where ``first`` (an episode's first step) the mean is all
    zeros, since the previous plan belongs to another episode.

    Args:
        plan: the carry, ``mean`` of shape ``[..., H, A]``.
        first: bool of shape ``[...]`` (the batch shape of ``plan``), or a scalar.

    Returns:
        ``[..., H, A]`` mean.
    """
    mean = plan.mean
    shifted = jnp.concatenate([mean[..., 1:, :], jnp.zeros_like(mean[..., :1, :])], axis=-2)
    first = jnp.asarray(first, bool)
    return jnp.where(first[..., None, None], jnp.zeros_like(shifted), shifted)


def elite_weights(config: PlannerConfig, elite_values: jax.Array) -> jax.Array:
    """Normalized weights of the ``[K]`` elites (sorted best first): MPPI softmax or CEM uniform.

    MPPI: ``w_i = exp(temperature * (V_i - max V)) / sum_j exp(temperature * (V_j - max V))``
    (TD-MPC2's ``score``). Elites with value ``-inf`` (NaN values are ranked as ``-inf``) get
    weight 0; if every elite is invalid, the weights are uniform.
    """
    num = elite_values.shape[-1]
    if config.method == "cem":
        return jnp.full(elite_values.shape, 1.0 / num, elite_values.dtype)
    best = jnp.max(elite_values, axis=-1, keepdims=True)
    logits = config.temperature * (elite_values - best)
    logits = jnp.where(jnp.isfinite(best), logits, 0.0)
    return jax.nn.softmax(logits, axis=-1)


def refit(
    config: PlannerConfig,
    elites: jax.Array,
    weights: jax.Array,
    old_mean: jax.Array,
    old_std: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """New ``(mean, std)`` ``[H, A]`` from ``[K, H, A]`` elites and their ``[K]`` weights.

    The weighted mean and (biased) weighted standard deviation about the new mean, smoothed by
    ``momentum`` (mbrl-lib's ``alpha``; 0 = no smoothing, TD-MPC2), std clipped to
    ``[min_std, max_std]``. The smoothing applies to the std, as the issue-16 contract states;
    mbrl-lib's ``CEMOptimizer`` smooths the variance instead.
    """
    w = weights[:, None, None]
    mean = jnp.sum(w * elites, axis=0)
    std = jnp.sqrt(jnp.sum(w * (elites - mean) ** 2, axis=0))
    if config.momentum > 0.0:
        mean = config.momentum * old_mean + (1.0 - config.momentum) * mean
        std = config.momentum * old_std + (1.0 - config.momentum) * std
    return mean, jnp.clip(std, config.min_std, config.max_std)


def plan(
    config: PlannerConfig,
    value_fn: ValueFn,
    plan_state: PlanState,
    first: jax.Array | bool,
    key: jax.Array,
    policy_actions: jax.Array | None = None,
    low: float | jax.Array = -1.0,
    high: float | jax.Array = 1.0,
) -> tuple[PlanResult, PlanState]:
    """Plan an action sequence for one environment by MPPI or CEM.

    Each iteration evaluates ``num_samples`` sequences: ``num_samples - num_policy_samples``
    Gaussian samples around ``(mean, std)`` clipped to ``[low, high]``, plus the policy samples.
    The ``num_elites`` best refit ``(mean, std)`` (see ``elite_weights`` and ``refit``).

    Pure and traceable: ``jax.jit`` the caller (``config`` and ``value_fn`` are static) and
    ``jax.vmap`` over environments (close ``value_fn`` over each environment's state).

    Args:
        config: the planner's configuration.
        value_fn: ``value_fn(actions [N, H, A], key) -> [N]`` return estimates, higher is better.
        plan_state: the previous call's ``PlanState`` (``mean [H, A]``), or ``init_plan``'s.
        first: scalar bool, True at an episode's first step (the warm start is discarded).
        key: PRNG key.
        policy_actions: ``[num_policy_samples, H, A]`` sequences from a policy prior (clipped to
            ``[low, high]``), or None when ``num_policy_samples == 0``.
        low: lower action bound, scalar or ``[A]``.
        high: upper action bound, scalar or ``[A]``.

    Returns:
        ``(PlanResult, PlanState)``: the result, and the carry for the next step (the final mean).
    """
    horizon, action_dim = plan_state.mean.shape[-2:]
    if plan_state.mean.ndim != 2 or horizon != config.horizon:
        raise ValueError(
            f"plan() plans for one environment: plan_state.mean must have shape "
            f"(horizon={config.horizon}, action_dim), got {plan_state.mean.shape}; "
            "jax.vmap plan() over environments, and build the state with init_plan(config, ...)."
        )
    num_pi = config.num_policy_samples
    if num_pi > 0:
        expected = (num_pi, horizon, action_dim)
        if policy_actions is None or tuple(policy_actions.shape) != expected:
            got = None if policy_actions is None else tuple(policy_actions.shape)
            raise ValueError(
                f"plan() needs policy_actions of shape {expected} "
                f"(num_policy_samples, horizon, action_dim), got {got}."
            )
        policy_actions = jnp.clip(policy_actions, low, high).astype(plan_state.mean.dtype)
    elif policy_actions is not None:
        raise ValueError(
            "plan() got policy_actions but PlannerConfig.num_policy_samples is 0; "
            "set num_policy_samples to policy_actions.shape[0] or pass None."
        )

    num_gauss = config.num_samples - num_pi
    mean0 = warm_start(plan_state, first)
    std0 = jnp.full_like(mean0, config.max_std)

    def evaluate(mean: jax.Array, std: jax.Array, key: jax.Array):
        key_noise, key_value = jax.random.split(key)
        noise = jax.random.normal(key_noise, (num_gauss, horizon, action_dim), mean.dtype)
        actions = jnp.clip(mean + std * noise, low, high)
        if num_pi > 0:
            actions = jnp.concatenate([policy_actions, actions], axis=0)
        values = jnp.asarray(value_fn(actions, key_value))
        if values.shape != (config.num_samples,):
            raise ValueError(
                f"value_fn must return one value per sequence, shape ({config.num_samples},), "
                f"got {values.shape}."
            )
        # NaN (a diverged model rollout) ranks last instead of poisoning the weights.
        values = jnp.where(jnp.isnan(values), -jnp.inf, values).astype(mean.dtype)
        elite_values, idx = jax.lax.top_k(values, config.num_elites)
        return actions[idx], elite_values

    def iteration(carry, key):
        mean, std, _, _ = carry
        elites, elite_values = evaluate(mean, std, key)
        weights = elite_weights(config, elite_values)
        mean, std = refit(config, elites, weights, mean, std)
        return (mean, std, elites, elite_values), None

    key, key_choice = jax.random.split(key)
    elites0 = jnp.zeros((config.num_elites, horizon, action_dim), mean0.dtype)
    values0 = jnp.zeros((config.num_elites,), mean0.dtype)
    carry = (mean0, std0, elites0, values0)
    (mean, std, elites, elite_values), _ = jax.lax.scan(
        iteration, carry, jax.random.split(key, config.iterations)
    )
    weights = elite_weights(config, elite_values)
    choice = jax.random.categorical(key_choice, jnp.log(weights))
    result = PlanResult(actions=elites[choice], mean=mean, std=std, value=elite_values[0])
    return result, PlanState(mean=mean)


__all__ = [
    "PLANNER_METHODS",
    "PlanResult",
    "PlanState",
    "PlannerConfig",
    "PlannerMethod",
    "ValueFn",
    "elite_weights",
    "init_plan",
    "plan",
    "refit",
    "warm_start",
]
