"""PETS's probabilistic ensemble (``jaxrl.agents.pets``): the network, its NLL and its training.

A member is a Gaussian MLP (``GaussianMLP``) with a softly bounded log-variance
(``bound_logvar``); inputs are standardized with statistics of the whole replay buffer
(``buffer_stats``, ``normalize_inputs``); the stored rows are shuffled with a traced count
(``shuffled_prefix``); ``model_loss`` is the training loss and ``member_mse`` the held-out
score; ``fit_with_early_stopping`` is mbrl-lib's ``ModelTrainer.train`` loop
(epochs, early stopping on a held-out score, the best epoch's weights kept). The known rewards
and terminations that ``pets.REWARD_FNS`` / ``pets.TERMINATION_FNS`` name live here too, with
``alive_returns``, the planned return that stops at the first predicted termination.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl.normalization import RunningStats

# The agent is passed in (typed Any): importing it here would make this module and ``pets``
# import each other.


def pendulum_reward(obs: jax.Array, action: jax.Array, next_obs: jax.Array) -> jax.Array:
    """Pendulum-v1 / ``jax:pendulum`` reward from obs ``(cos th, sin th, thdot)``, torque 2a.

    ``-(th^2 + 0.1 thdot^2 + 0.001 u^2)`` of the state *before* the step, ``th`` in [-pi, pi].
    """
    del next_obs
    th = jnp.arctan2(obs[..., 1], obs[..., 0])
    u = 2.0 * jnp.clip(action[..., 0], -1.0, 1.0)
    return -(th**2 + 0.1 * obs[..., 2] ** 2 + 0.001 * u**2)


def inverted_pendulum_termination(
    obs: jax.Array, action: jax.Array, next_obs: jax.Array
) -> jax.Array:
    """InvertedPendulum-v5 ``done``: ``next_obs`` non-finite or its pole angle ``|obs[1]| > 0.2``.

    mbrl-lib's ``termination_fns.inverted_pendulum`` (and Gymnasium's own check).
    """
    del obs, action
    alive = jnp.isfinite(next_obs).all(axis=-1) & (jnp.abs(next_obs[..., 1]) <= 0.2)
    return ~alive


def alive_returns(rewards: jax.Array, dones: jax.Array) -> jax.Array:
    """Sum over steps (axis 0) of ``rewards [H, ...]`` up to and including the first ``done``.

    mbrl-lib's ``ModelEnv.evaluate_action_sequences``: ``done`` is sticky, so step t's reward
    counts iff no step before t terminated (``r_t * (1 - done_{<t})``); a zeroed reward may be
    NaN (a rollout past its termination can diverge), hence ``where`` rather than a product.
    """
    chex.assert_equal_shape([rewards, dones])
    done = dones.astype(jnp.int32)
    done_before = jnp.cumsum(done, axis=0) - done > 0
    return jnp.where(done_before, 0.0, rewards).sum(axis=0)


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


def normalize_inputs(stats: RunningStats, x: jax.Array) -> jax.Array:
    """``(x - mean) / std``; a (near-)constant dimension (std < 1e-5) is only centered."""
    std = jnp.sqrt(stats.var)
    return (x - stats.mean) / jnp.where(std < 1e-5, 1.0, std)


def buffer_stats(x: jax.Array, size: jax.Array) -> RunningStats:
    """Mean and (population) variance of the first ``size`` rows of ``x [capacity, d]``.

    The stored rows of a replay buffer are its first ``size`` (``jaxrl.buffers``), so this is
    mbrl-lib's ``update_normalizer(replay_buffer.get_all())`` (which uses the n - 1 variance).
    """
    valid = (jnp.arange(x.shape[0]) < size)[:, None]
    n = jnp.maximum(size, 1).astype(jnp.float32)
    mean = jnp.where(valid, x, 0.0).sum(0) / n
    var = jnp.where(valid, (x - mean) ** 2, 0.0).sum(0) / n
    return RunningStats(count=n, mean=mean, var=var)


def shuffled_prefix(key: jax.Array, capacity: int, n: jax.Array) -> jax.Array:
    """A random order of ``0 .. n - 1`` (``n`` may be traced) in the first ``n`` of ``capacity``.

    The rest are ``n .. capacity - 1``; the order is uniform (one sort of ``capacity`` keys).
    """
    keys = jax.random.uniform(key, (capacity,))
    return jnp.argsort(jnp.where(jnp.arange(capacity) < n, keys, 2.0)).astype(jnp.int32)


def model_loss(
    params: dict, agent: Any, x: jax.Array, y: jax.Array, mask: jax.Array | None = None
) -> tuple[jax.Array, dict]:
    """Ensemble NLL with the log-variance bound regularizer (PETS eq. 2 and appendix A.1).

    ``x [E, B, in]``, ``y [E, B, out]``: each member's own (bootstrap) rows; ``mask [B]`` marks
    the real rows of a short last batch. The NLL is averaged over rows and dimensions and
    summed over members, plus ``0.01 (sum max_lv - sum min_lv)``.
    """
    mask = jnp.ones(x.shape[1]) if mask is None else mask.astype(jnp.float32)
    weight = mask / jnp.maximum(mask.sum(), 1.0)
    mean, logvar = agent.predict(params, x)
    nll = (gaussian_nll(mean, logvar, y).mean(axis=2) * weight).sum(axis=1).sum()
    reg = 0.01 * (params["max_logvar"].sum() - params["min_logvar"].sum())
    if not agent.config.learn_logvar_bounds:
        reg = jax.lax.stop_gradient(reg)  # fixed bounds: a constant, as in mbrl-lib
    mse = (((mean - y) ** 2).mean(axis=2) * weight).sum(axis=1)
    info = {"model/nll": nll, "model/mse": mse.mean(), "model/logvar": logvar.mean()}
    return nll + reg, info


def member_mse(
    agent: Any, params: dict, data: Any, rows: tuple[jax.Array, jax.Array, jax.Array]
) -> jax.Array:
    """Each member's MSE (``[E]``) of its mean on the buffer rows ``order[start:][:count]``.

    ``rows = (order, start, count)`` (traced ``start`` and ``count``); read in chunks.
    """
    order, start, count = rows
    e, chunk = agent.config.ensemble_size, min(order.shape[0], 1024)

    def body(i: jax.Array, total: jax.Array) -> jax.Array:
        j = i * chunk + jnp.arange(chunk)
        idx = order[jnp.minimum(start + j, order.shape[0] - 1)]
        x, y = agent.model_data(jax.tree.map(lambda d: d[idx], data))
        mean, _ = agent.predict(params, jnp.broadcast_to(x, (e, *x.shape)))
        return total + (((mean - y) ** 2).mean(-1) * (j < count)).sum(-1)

    total = jax.lax.fori_loop(0, -(-count // chunk), body, jnp.zeros(e))
    return total / jnp.maximum(count, 1)


def fit_with_early_stopping(
    model: TrainState,
    train_epoch: Callable[[TrainState, jax.Array], tuple[TrainState, jax.Array]],
    score: Callable[[dict], jax.Array],
    start: jax.Array,
    key: jax.Array,
    *,
    max_epochs: int,
    patience: int,
    threshold: float,
) -> tuple[TrainState, jax.Array, jax.Array, jax.Array]:
    """Train epochs until ``max_epochs``, or ``patience`` epochs without improvement (0: never).

    mbrl-lib's ``ModelTrainer.train``: ``score(params)`` is each member's held-out error,
    ``start`` its value before training; after every epoch, the epoch improves when some
    member's score fell by more than ``threshold`` relative to its best, and then the
    parameters are kept and every member's best becomes ``min(best, score)``. At the end the
    kept parameters replace the last epoch's (unless no epoch improved). Returns ``(model,
    best scores, epochs run, last epoch's mean loss)``.
    """

    def epoch(carry: tuple) -> tuple:
        model, best, best_params, improved_ever, since, i, key, _ = carry
        key, k = jax.random.split(key)
        model, loss = train_epoch(model, k)
        new = score(model.params)
        improved = jnp.any((best - new) / jnp.abs(best) > threshold)
        best = jnp.where(improved, jnp.minimum(best, new), best)
        best_params = jax.tree.map(
            lambda p, q: jnp.where(improved, p, q), model.params, best_params
        )
        since = jnp.where(improved, 0, since + 1)
        return model, best, best_params, improved_ever | improved, since, i + 1, key, loss

    def more(carry: tuple) -> jax.Array:
        since, i = carry[4], carry[5]
        return (i < max_epochs) & ((since < patience) if patience else True)

    zero = jnp.int32(0)
    carry = (model, start, model.params, jnp.bool_(False), zero, zero, key, jnp.float32(0))
    model, best, best_params, improved, _, epochs, _, loss = jax.lax.while_loop(more, epoch, carry)
    params = jax.tree.map(lambda p, q: jnp.where(improved, p, q), best_params, model.params)
    return model.replace(params=params), best, epochs, loss


__all__ = [
    "GaussianMLP",
    "bound_logvar",
    "buffer_stats",
    "fit_with_early_stopping",
    "gaussian_nll",
    "member_mse",
    "model_loss",
    "normalize_inputs",
    "shuffled_prefix",
]
