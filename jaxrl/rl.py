"""RL math as small pure functions (in the spirit of rlax)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl.types import Params


def td_target(
    reward: jax.Array, terminal: jax.Array, next_value: jax.Array, discount: float | jax.Array
) -> jax.Array:
    """One-step TD target ``r + gamma * (1 - terminal) * V(s')``.

    Truncated episodes have ``terminal = 0`` and are bootstrapped; only true terminations cut the
    return (Pardo et al., 2018, "Time Limits in Reinforcement Learning").

    Args:
        reward: ``[B]`` rewards.
        terminal: ``[B]`` 1.0 where the episode terminated.
        next_value: ``[B]`` value estimate of the next state.
        discount: scalar discount factor gamma.

    Returns:
        ``[B]`` targets (not stop-gradiented; callers decide).
    """
    chex.assert_rank([reward, terminal, next_value], 1)
    chex.assert_equal_shape([reward, terminal, next_value])
    return reward + discount * (1.0 - terminal) * next_value


def polyak_update(params: Params, target_params: Params, tau: float | jax.Array) -> Params:
    """Soft target update ``target <- tau * params + (1 - tau) * target``."""
    return jax.tree.map(lambda p, t: tau * p + (1.0 - tau) * t, params, target_params)


def scheduled_polyak(
    params: Params,
    target_params: Params,
    step: jax.Array,
    tau: float | jax.Array,
    every: int = 1,
    start: int = 0,
) -> Params:
    """Polyak update on updates ``step >= start`` with ``step % every == 0``; otherwise unchanged.

    The exponential moving average of a policy's parameters kept by the diffusion agents: IDQL
    updates it every step (``tau = 0.001``); Diffusion-QL every 5 steps from step 1,000
    (``tau = 1 - 0.995``), leaving the initial copy in place before that.
    """
    active = (step >= start) & (step % every == 0)
    return polyak_update(params, target_params, jnp.where(active, tau, 0.0))


def ensemble_td_loss(qs: jax.Array, target: jax.Array) -> jax.Array:
    """Squared TD error of every critic, summed over the ``[num_qs, B]`` ensemble, batch mean.

    The twin-critic regression of TD3, IQL and Diffusion-QL: ``E_B[sum_i (Q_i - y)^2]``.
    """
    chex.assert_rank([qs, target], [2, 1])
    return jnp.mean(jnp.sum((qs - target[None]) ** 2, axis=0))


def min_over_ensemble(qs: jax.Array) -> jax.Array:
    """Clipped double-Q: minimum over the leading ensemble axis of ``[num_qs, B]`` values."""
    chex.assert_rank(qs, 2)
    return jnp.min(qs, axis=0)


def ensemble_subset(key: jax.Array, params: Params, num: int | None) -> Params:
    """The parameters of ``num`` members of an ensemble, drawn without replacement.

    The REDQ / RLPD target takes the minimum over a random subset of the target critics; taking
    the subset of the parameters (as the RLPD authors do) evaluates only those members, which
    for RLPD's 2 of 10 is a fifth of the target's cost. Every leaf of ``params`` has the member
    axis first (``networks.ensemble``); ``num=None`` (or the full size) returns ``params``.
    """
    size = jax.tree.leaves(params)[0].shape[0]
    if num is None or num >= size:
        return params
    idx = jax.random.choice(key, size, (num,), replace=False)
    return jax.tree.map(lambda p: p[idx], params)


def gae_advantages(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    done: jax.Array,
    discount: float | jax.Array,
    lam: float | jax.Array,
) -> jax.Array:
    """Generalized advantage estimates over a time-major rollout.

    Schulman et al. (2016), "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 11-16: ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` and
    ``A_t = sum_l (gamma * lambda)^l delta_{t+l}``, computed backwards as
    ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}``.

    ``next_values`` are the values of each transition's true next observation, so a time-limit
    truncation bootstraps from the real final state (Pardo et al., 2018) while ``done`` stops the
    trace from running into the next, auto-reset episode. Only ``terminated`` zeroes the bootstrap.

    Args:
        rewards: ``[T, N]`` (already scaled) rewards.
        values: ``[T, N]`` ``V(obs_t)``.
        next_values: ``[T, N]`` ``V(next_obs_t)`` of the true next observations.
        terminated: ``[T, N]`` 1.0 where the episode truly terminated at step t.
        done: ``[T, N]`` 1.0 where the episode ended at step t (terminated or truncated).
        discount: scalar gamma.
        lam: scalar GAE lambda.

    Returns:
        ``[T, N]`` advantages; the value targets (lambda-returns) are ``advantages + values``.
    """
    chex.assert_rank([rewards, values, next_values, terminated, done], 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, done])
    deltas = rewards + discount * (1.0 - terminated) * next_values - values

    def backward(acc: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, d = x
        acc = delta + discount * lam * (1.0 - d) * acc
        return acc, acc

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, done), reverse=True)
    return advantages


def gae_value_targets(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    discount: float | jax.Array,
    lam: float | jax.Array,
    bootstrap_truncated: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Brax PPO's value targets ``v_s`` and policy advantages over time-major segments.

    GAE (Schulman et al., 2016, eq. 16) as Brax's ``compute_gae``: ``v_s = V(s) + A^GAE`` are the
    value targets, and the policy's advantages are the one-step estimates on them,
    ``r_t + gamma * (1 - term_t) * v_{t+1} - V(s_t)`` (V-trace's policy-gradient advantage with
    unit importance weights, Espeholt et al., 2018, eq. 4), with ``v_T = V(s_T)`` at a segment's
    end. A time-limit step gets neither a TD error nor an advantage, as in Brax; with
    ``bootstrap_truncated`` it bootstraps from ``V`` of the true final observation instead
    (Pardo et al., 2018). Where a step both terminates and truncates, termination wins.

    Args:
        rewards: ``[T, B]`` (already scaled) rewards.
        values: ``[T, B]`` ``V(obs_t)``.
        next_values: ``[T, B]`` ``V`` of each step's next observation. Only the last step and
            (with ``bootstrap_truncated``) the truncated steps need the true next observation's
            value; elsewhere ``values[t + 1]`` is the same number.
        terminated: ``[T, B]`` 1.0 where the episode truly terminated at step t.
        truncated: ``[T, B]`` 1.0 where a time limit ended the episode at step t.
        discount: scalar gamma.
        lam: scalar GAE lambda.
        bootstrap_truncated: keep time-limit steps, bootstrapped (static).

    Returns:
        ``(v_s [T, B], advantages [T, B])``, without gradient.
    """
    chex.assert_rank([rewards, values, next_values, terminated, truncated], 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, truncated])
    truncated = truncated * (1.0 - terminated)
    done = jnp.maximum(terminated, truncated)
    keep = jnp.ones_like(truncated) if bootstrap_truncated else 1.0 - truncated
    # Scaling every term of delta_t by keep_t zeroes the TD error of the dropped steps.
    gae = gae_advantages(
        rewards * keep, values * keep, next_values * keep, terminated, done, discount, lam
    )
    vs = values + gae
    ends = done.at[-1].set(1.0)  # where v_{t+1} is not the next row's v_s
    next_vs = jnp.where(ends > 0, next_values, jnp.concatenate([vs[1:], vs[-1:]]))
    advantages = (rewards + discount * (1.0 - terminated) * next_vs - values) * keep
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(advantages)


def ppo_clipped_objective(
    ratio: jax.Array, advantage: jax.Array, clip_eps: float | jax.Array
) -> jax.Array:
    """Per-sample clipped surrogate objective (to maximize).

    Schulman et al. (2017), "Proximal Policy Optimization Algorithms", eq. 7:
    ``L^CLIP = min(r * A, clip(r, 1 - eps, 1 + eps) * A)`` with ``r = pi(a|s) / pi_old(a|s)``.

    Args:
        ratio: ``[B]`` probability ratios.
        advantage: ``[B]`` advantage estimates.
        clip_eps: scalar clipping range epsilon.

    Returns:
        ``[B]`` objective values; the PPO policy loss is minus their mean.
    """
    chex.assert_rank([ratio, advantage], 1)
    chex.assert_equal_shape([ratio, advantage])
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return jnp.minimum(ratio * advantage, clipped * advantage)


def smoothed_target_actions(
    key: jax.Array,
    actions: jax.Array,
    noise_std: float | jax.Array,
    noise_clip: float | jax.Array,
) -> jax.Array:
    """Target policy smoothing: ``clip(a + clip(eps, -c, c), -1, 1)``, ``eps ~ N(0, sigma^2)``.

    Fujimoto et al. (2018), "Addressing Function Approximation Error in Actor-Critic Methods"
    (TD3), eq. 14; used by TD3, TD3+BC and ReBRAC for the next action of the TD target.

    Args:
        key: PRNG key of the noise.
        actions: ``[..., act_dim]`` target-policy actions in ``[-1, 1]``.
        noise_std: scalar noise standard deviation sigma.
        noise_clip: scalar clip range c of the noise.

    Returns:
        Noisy actions of the same shape, in ``[-1, 1]``.
    """
    noise = jnp.clip(noise_std * jax.random.normal(key, actions.shape), -noise_clip, noise_clip)
    return jnp.clip(actions + noise, -1.0, 1.0)


def expectile_loss(diff: jax.Array, expectile: float | jax.Array) -> jax.Array:
    """Asymmetric squared loss ``|tau - 1(u < 0)| * u^2`` of ``u = diff`` (unreduced).

    Kostrikov et al. (2021), "Offline Reinforcement Learning with Implicit Q-Learning", eq. 3
    (the value loss of eq. 5 applies it): minimizing its mean over ``u = target - prediction``
    makes the prediction the ``tau``-expectile of the target (``tau = 0.5`` gives the mean,
    ``tau -> 1`` the maximum).

    Args:
        diff: ``[B]`` residuals ``target - prediction``.
        expectile: scalar ``tau`` in (0, 1).

    Returns:
        ``[B]`` per-sample losses; callers take the mean.
    """
    chex.assert_rank(diff, 1)
    weight = jnp.where(diff < 0, 1.0 - expectile, expectile)
    return weight * diff**2


def awr_weights(
    advantage: jax.Array, temperature: float | jax.Array, max_weight: float | jax.Array = 100.0
) -> jax.Array:
    """Advantage weights ``min(exp(beta * A), max_weight)``, without gradient.

    The policy-extraction weights of Kostrikov et al. (2021), IQL eq. 7 (after Peng et al., 2019,
    "Advantage-Weighted Regression"), clipped as in the IQL authors' code (``max_weight = 100``).

    Args:
        advantage: ``[B]`` advantages ``Q(s, a) - V(s)``.
        temperature: scalar inverse temperature ``beta`` (0 = behavior cloning).
        max_weight: upper clip of the weights, which keeps one large advantage from dominating.

    Returns:
        ``[B]`` non-negative, stop-gradiented weights.
    """
    chex.assert_rank(advantage, 1)
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(temperature * advantage), max_weight))


def bc_mse(pred_actions: jax.Array, actions: jax.Array) -> jax.Array:
    """Behavior-cloning regression ``mean((pi(s) - a)^2)`` over batch and action dimensions.

    The deterministic BC objective (e.g. Fujimoto & Gu, 2021, "A Minimalist Approach to Offline
    RL", eq. 3's BC term; CORL's and d3rlpy's BC).

    Args:
        pred_actions: ``[B, act_dim]`` policy actions.
        actions: ``[B, act_dim]`` dataset actions.

    Returns:
        Scalar loss.
    """
    chex.assert_rank([pred_actions, actions], 2)
    chex.assert_equal_shape([pred_actions, actions])
    return jnp.mean((pred_actions - actions) ** 2)


def gaussian_log_prob(x: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """Log-density of ``x`` under a diagonal Gaussian, summed over the last axis.

    Args:
        x: ``[..., d]`` points.
        mean: ``[..., d]`` means (broadcastable to ``x``).
        std: ``[..., d]`` standard deviations (broadcastable to ``x``; > 0).

    Returns:
        ``[...]`` log-densities.
    """
    z = (x - mean) / std
    return jnp.sum(-0.5 * z**2 - jnp.log(std) - 0.5 * jnp.log(2.0 * jnp.pi), axis=-1)


def symlog(x: jax.Array) -> jax.Array:
    """Symmetric logarithm ``sign(x) * log(1 + |x|)`` (Hafner et al., 2023, DreamerV3, eq. 9)."""
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x: jax.Array) -> jax.Array:
    """Inverse of ``symlog``: ``sign(x) * (exp(|x|) - 1)``."""
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def _check_bins(num_bins: int, vmin: float, vmax: float) -> None:
    if num_bins < 2 or not vmin < vmax:
        raise ValueError(
            f"two-hot encoding needs num_bins >= 2 and vmin < vmax, got num_bins={num_bins}, "
            f"vmin={vmin}, vmax={vmax}."
        )


def two_hot(x: jax.Array, num_bins: int, vmin: float, vmax: float) -> jax.Array:
    """Two-hot encoding of scalars in symlog space (DreamerV3; TD-MPC2's discrete regression).

    ``symlog(x)`` is clipped to ``[vmin, vmax]`` and split between its two neighbouring bins of
    ``linspace(vmin, vmax, num_bins)``, linearly by distance, so that the bins' expectation under
    the encoding is exactly ``symlog(x)``. TD-MPC2 (Hansen et al., 2024) regresses rewards and
    values this way over 101 bins in ``[-10, 10]``.

    Args:
        x: ``[...]`` scalars in the original (not symlog) space.
        num_bins: number of bins (>= 2, static).
        vmin: lowest bin, in symlog space.
        vmax: highest bin, in symlog space.

    Returns:
        ``[..., num_bins]`` non-negative weights summing to 1.
    """
    _check_bins(num_bins, vmin, vmax)
    bin_size = (vmax - vmin) / (num_bins - 1)
    pos = (jnp.clip(symlog(x), vmin, vmax) - vmin) / bin_size
    # The last bin is reached as (idx = num_bins - 2, offset = 1): no index ever runs past the end.
    idx = jnp.clip(jnp.floor(pos), 0, num_bins - 2)
    offset = (pos - idx)[..., None]
    idx = idx.astype(jnp.int32)
    lower = jax.nn.one_hot(idx, num_bins, dtype=offset.dtype)
    upper = jax.nn.one_hot(idx + 1, num_bins, dtype=offset.dtype)
    return lower * (1.0 - offset) + upper * offset


def two_hot_inv(logits: jax.Array, vmin: float, vmax: float) -> jax.Array:
    """Decode bin logits to a scalar: ``symexp(sum_i softmax(logits)_i * bin_i)``.

    Args:
        logits: ``[..., num_bins]`` unnormalized log-probabilities over
            ``linspace(vmin, vmax, num_bins)`` (symlog space).
        vmin: lowest bin, in symlog space.
        vmax: highest bin, in symlog space.

    Returns:
        ``[...]`` scalars in the original space.
    """
    num_bins = logits.shape[-1]
    _check_bins(num_bins, vmin, vmax)
    bins = jnp.linspace(vmin, vmax, num_bins, dtype=logits.dtype)
    return symexp(jnp.sum(jax.nn.softmax(logits, axis=-1) * bins, axis=-1))


def soft_ce(logits: jax.Array, target: jax.Array, vmin: float, vmax: float) -> jax.Array:
    """Cross-entropy of bin logits against the two-hot encoding of scalar targets (unreduced).

    ``-sum_i two_hot(target)_i * log_softmax(logits)_i``: the reward and value cross-entropy
    terms of TD-MPC2's model objective (Hansen et al., 2024, Sec. 3).

    Args:
        logits: ``[..., num_bins]`` predicted bin logits.
        target: ``[...]`` scalar targets in the original space (no gradient flows into them).
        vmin: lowest bin, in symlog space.
        vmax: highest bin, in symlog space.

    Returns:
        ``[...]`` per-element losses; callers reduce.
    """
    chex.assert_equal_shape_prefix([logits, target], target.ndim)
    chex.assert_rank(logits, target.ndim + 1)
    soft = two_hot(jax.lax.stop_gradient(target), logits.shape[-1], vmin, vmax)
    return -jnp.sum(soft * jax.nn.log_softmax(logits, axis=-1), axis=-1)
