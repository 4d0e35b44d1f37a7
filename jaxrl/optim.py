"""Optimizer helpers shared by every agent: train states whose hyperparameters are pytree leaves.

``make_train_state`` pairs a network with Adam (its learning rate injected, so a vmapped sweep
compiles once); ``make_stats_train_state`` does the same for networks with running statistics
(``BatchRenorm``), kept apart from the trained parameters; ``gradient_step`` is every agent's
per-network update, and ``when`` runs a delayed one. ``jaxrl.networks`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from jaxrl.types import Params


def _adam(
    learning_rate: jax.Array, decay_steps: int | None, max_grad_norm: float | None
) -> optax.GradientTransformation:
    # The base rate stays an injected leaf (sweepable); only the decay factor is scheduled.
    if decay_steps is None:
        tx = optax.adam(learning_rate)
    else:
        cosine = optax.cosine_decay_schedule(1.0, decay_steps)
        tx = optax.adam(lambda count: learning_rate * cosine(count))
    if max_grad_norm is None:
        return tx
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)


def make_train_state(
    module: nn.Module,
    key: jax.Array,
    learning_rate: float,
    *example_inputs: jax.Array,
    cosine_decay_steps: int | None = None,
    max_grad_norm: float | None = None,
) -> TrainState:
    """Initialize ``module`` and an Adam optimizer whose learning rate is a pytree leaf.

    ``optax.inject_hyperparams`` keeps the learning rate in the optimizer state, so a vmapped
    sweep over learning rates compiles once.

    Args:
        module: the network.
        key: PRNG key of the parameter initialization.
        learning_rate: Adam step size (``opt_state.hyperparams["learning_rate"]``).
        *example_inputs: example inputs of ``module.init``.
        cosine_decay_steps: if set, the step size is multiplied by a cosine decay from 1 to 0
            over this many updates (then stays 0), as the IQL authors' actor optimizer.
        max_grad_norm: if set, gradients are clipped to this global norm before Adam
            (Diffusion-QL's ``grad_norm``).
    """
    params = module.init(key, *example_inputs)
    if cosine_decay_steps is None and max_grad_norm is None:
        tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    else:
        tx = optax.inject_hyperparams(_adam, static_args=("decay_steps", "max_grad_norm"))(
            learning_rate=learning_rate, decay_steps=cosine_decay_steps, max_grad_norm=max_grad_norm
        )
    return TrainState.create(apply_fn=module.apply, params=params, tx=tx)


def hparam_leaves(config: object, *names: str) -> dict[str, jax.Array]:
    """``{name: float32(config.name)}``: the named config values as sweepable pytree leaves."""
    return {name: jnp.float32(getattr(config, name)) for name in names}


def gradient_step(state: TrainState, loss_fn: Callable, *args: object) -> tuple[TrainState, dict]:
    """One optimizer step on ``loss_fn(state.params, *args) -> (loss, info)``; returns the info.

    Every agent's per-network update is this: differentiate a loss that returns ``(loss, info)``
    with respect to one train state's parameters and apply the optimizer.
    """
    grads, info = jax.grad(loss_fn, has_aux=True)(state.params, *args)
    return state.apply_gradients(grads=grads), info


def stats_gradient_step(
    state: TrainState, loss_fn: Callable, *args: object
) -> tuple[TrainState, dict, Params]:
    """``gradient_step`` for a loss over a network with running statistics.

    ``loss_fn(state.params, *args) -> (loss, (info, batch_stats))``: the forward pass in training
    mode also yields the network's new running statistics, which the optimizer never sees.
    Returns the stepped state, the info and the new statistics.
    """
    grads, (info, stats) = jax.grad(loss_fn, has_aux=True)(state.params, *args)
    return state.apply_gradients(grads=grads), info, stats


def make_stats_train_state(
    module: nn.Module, key: jax.Array, learning_rate: float, *example_inputs: jax.Array, b1: float
) -> tuple[TrainState, Params]:
    """A train state over ``module``'s ``params`` collection, and its ``batch_stats`` apart.

    For networks with running statistics (``BatchRenorm``): the statistics are set by forward
    passes (``mutable=["batch_stats"]``), never by the optimizer, so they stay out of its state.
    Apply as ``state.apply_fn({**state.params, "batch_stats": stats}, ...)``. Adam's learning
    rate and ``b1`` (CrossQ: 0.5) are injected leaves, as in ``make_train_state``.
    """
    variables = module.init(key, *example_inputs)
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate, b1=b1)
    params = {"params": variables["params"]}
    return TrainState.create(apply_fn=module.apply, params=params, tx=tx), variables["batch_stats"]


def when(
    due: jax.Array | bool, step: Callable[[Any], tuple[Any, Any]], state: Any
) -> tuple[Any, Any]:
    """``step(state) -> (state, info)`` if ``due``, else ``state`` unchanged and zeros as info.

    A delayed update inside a jitted ``update`` (SAC's RLPD schedule, CrossQ's policy delay):
    ``due`` may be traced (a ``lax.cond``) or ``True`` (the step, without a cond). The zeros keep
    the info's structure, and are finite (the loops count non-finite infos).
    """
    if due is True:
        return step(state)

    def skip(state: Any) -> tuple[Any, Any]:
        shapes = jax.eval_shape(step, state)[1]
        return state, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    return jax.lax.cond(due, step, skip, state)
