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
- ``"cem"``: the cross-entropy method (Rubinstein, 1999; as used by PETS, Chua et al., 2018) in
  the form of mbrl-lib's ``CEMOptimizer`` (facebookresearch/mbrl-lib,
  ``mbrl/planning/trajectory_opt.py``, truncated-normal sampling; ``truncated_normal_`` in
  ``mbrl/util/math.py``): each population is drawn from a normal truncated at 2 standard
  deviations whose variance is capped at ``((distance from the mean to the nearer bound) / 2)^2``,
  so every sample lies inside ``[low, high]`` without piling up on the bounds; the elites
  (uniform weights) refit the mean and the *unbiased* variance, each smoothed by ``momentum``
  (mbrl-lib's ``alpha``): ``var = momentum * var_old + (1 - momentum) * var_elites``.

The std starts at ``max_std``; MPPI clips it to ``[min_std, max_std]`` after each refit (TD-MPC2),
CEM only floors it at ``min_std`` (mbrl-lib: no clip, and a start of ``(high - low) / 4``). The mean
starts from the previous step's final mean shifted by one step (TD-MPC2's ``_prev_mean``; zeros
at an episode's first step). The returned action sequence is one elite drawn from the final
weights (Gumbel-max, i.e. categorical sampling, as TD-MPC2 does), and ``PlanState`` — a pytree
that checkpoints with the rest of a training state — carries the final mean to the next step.
Values that are NaN (a diverged model rollout) rank last for both methods (TD-MPC2 and mbrl-lib
count them as about 0, which can make a diverged rollout an elite when returns are negative).

``plan`` handles one environment; ``jax.vmap`` it over environments and ``jax.jit`` the caller.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal, get_args

import chex
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
    """Sampling-planner hyperparameters; defaults are TD-MPC2's (Hansen et al., 2024).

    ``method="mppi"`` follows TD-MPC2's ``_plan`` (nicklashansen/tdmpc2, ``tdmpc2/tdmpc2.py``);
    ``method="cem"`` follows mbrl-lib's ``CEMOptimizer`` (facebookresearch/mbrl-lib,
    ``mbrl/planning/trajectory_opt.py``): truncated-normal populations with the bound-capped
    variance, the unbiased elite variance smoothed by ``momentum``, no upper std clip.
    """

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
    """Lower clip of the sampling standard deviation (CEM: 0 is mbrl-lib's, no floor)."""
    max_std: float = 2.0
    """Initial sampling standard deviation; MPPI's upper clip too (CEM has none, as mbrl-lib)."""
    num_policy_samples: int = 0
    """Sequences from a policy prior included in each population (TD-MPC2's num_pi_trajs)."""
    momentum: float = 0.0
    """Refit smoothing, new = momentum * old + (1 - momentum) * elite fit, of the mean and of the
    std (MPPI) or the variance (CEM, mbrl-lib's alpha)."""

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
        if self.method == "cem" and self.num_elites < 2:
            raise ConfigError(
                f"PlannerConfig.num_elites ({self.num_elites}) must be >= 2 for CEM (the unbiased "
                "elite variance divides by num_elites - 1); raise --num-elites."
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
        std: ``[H, A]`` the final standard deviation (MPPI: clipped to ``[min_std, max_std]``;
            CEM: the square root of the smoothed variance, before the cap at the bounds).
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


def capped_variance(
    var: jax.Array, mean: jax.Array, low: float | jax.Array, high: float | jax.Array
) -> jax.Array:
    """CEM's sampling variance ``[H, A]``: ``var`` capped at ``(distance to nearer bound / 2)^2``.

    mbrl-lib's constrained variance: with samples truncated at 2 standard deviations, a ``mean``
    inside ``[low, high]`` (scalars or ``[A]``) yields none outside them.
    """
    to_bound = jnp.minimum(mean - low, high - mean)
    return jnp.minimum(var, jnp.square(to_bound / 2.0))


def sample_population(
    config: PlannerConfig,
    mean: jax.Array,
    std: jax.Array,
    key: jax.Array,
    num: int,
    low: float | jax.Array = -1.0,
    high: float | jax.Array = 1.0,
) -> jax.Array:
    """``[num, H, A]`` action sequences around ``(mean, std)`` ``[H, A]``, inside ``[low, high]``.

    MPPI (TD-MPC2): Gaussian samples clipped to the bounds. CEM (mbrl-lib): samples of a standard
    normal truncated to ``[-2, 2]``, scaled by the square root of ``capped_variance``, so none is
    clipped; the final clip only catches float rounding at the bounds.
    """
    chex.assert_equal_shape([mean, std])
    shape = (num, *mean.shape)
    if config.method == "cem":
        noise = jax.random.truncated_normal(key, -2.0, 2.0, shape, mean.dtype)
        scale = jnp.sqrt(capped_variance(jnp.square(std), mean, low, high))
    else:
        noise, scale = jax.random.normal(key, shape, mean.dtype), std
    return jnp.clip(mean + scale * noise, low, high)


def refit(
    config: PlannerConfig,
    elites: jax.Array,
    weights: jax.Array,
    old_mean: jax.Array,
    old_std: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """New ``(mean, std)`` ``[H, A]`` from ``[K, H, A]`` elites and their ``[K]`` weights.

    MPPI (TD-MPC2's ``_plan``): the weighted mean and the (biased) weighted standard deviation
    about it, each smoothed by ``momentum`` (0 in TD-MPC2), the std clipped to
    ``[min_std, max_std]``.

    CEM (mbrl-lib's ``CEMOptimizer``): the elites' mean and unbiased variance (``ddof=1``),
    ``mean = momentum * old_mean + (1 - momentum) * mean`` and
    ``var = momentum * old_std^2 + (1 - momentum) * var``; the std is ``sqrt(var)``, floored at
    ``min_std`` and not capped (the cap at the bounds applies when sampling).
    """
    chex.assert_rank(elites, 3)
    chex.assert_shape(weights, elites.shape[:1])
    m = config.momentum
    if config.method == "cem":
        mean = jnp.mean(elites, axis=0)
        var = jnp.var(elites, axis=0, ddof=1)
        mean = m * old_mean + (1.0 - m) * mean
        var = m * jnp.square(old_std) + (1.0 - m) * var
        return mean, jnp.maximum(jnp.sqrt(var), config.min_std)
    w = weights[:, None, None]
    mean = jnp.sum(w * elites, axis=0)
    std = jnp.sqrt(jnp.sum(w * (elites - mean) ** 2, axis=0))
    if m > 0.0:
        mean = m * old_mean + (1.0 - m) * mean
        std = m * old_std + (1.0 - m) * std
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
    samples around ``(mean, std)`` inside ``[low, high]`` (``sample_population``: clipped
    Gaussian for MPPI, bound-capped truncated normal for CEM), plus the policy samples. The
    ``num_elites`` best refit ``(mean, std)`` (see ``elite_weights`` and ``refit``).

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
        actions = sample_population(config, mean, std, key_noise, num_gauss, low, high)
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
    "capped_variance",
    "elite_weights",
    "init_plan",
    "plan",
    "refit",
    "sample_population",
    "warm_start",
]
