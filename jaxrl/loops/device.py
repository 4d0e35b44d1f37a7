"""Device-side helpers the loops share: strongly typed state, compiled chunks, the NaN guard.

The NaN guard: every loop state carries ``nonfinite``, a device-side count of the updates
after which the agent held a NaN, which ``guarded_update`` (the update call of every loop)
adds to; the harness reads it with the metrics at log points, as the column ``NONFINITE``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

NONFINITE = "train/nonfinite_updates"
"""Metrics column: updates so far after which the agent held a NaN."""


def strongly_typed(tree: Any) -> Any:
    """``tree`` with every leaf a strongly typed array.

    Weakly typed leaves (Python scalars, flax's ``TrainState.step``) come back strongly typed from
    a jitted chunk, which would recompile the chunk once; restoring into weak types would differ
    from what was saved.
    """
    return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.asarray(x).dtype), tree)


SMALL_ARRAY = 4096
"""Arrays of at most this many elements are what ``nonfinite`` checks."""


def nonfinite(agent: Any) -> jax.Array:
    """Whether ``agent`` holds a NaN in one of its small float arrays (a bool scalar).

    A non-finite loss makes every gradient non-finite, and after the optimizer step every
    parameter NaN (Adam's ``m / sqrt(v)`` of an infinite gradient is NaN). The small arrays
    (biases, scalars such as a temperature, their optimizer moments, data statistics) show it at
    a tiny fraction of the cost of a pass over all parameters, so the loops check after every
    update. An Inf alone is not flagged: it is the "off" value of sweepable thresholds (PPO's
    ``max_grad_norm`` and ``anneal_lr_steps``). Metrics are not checked: agents report NaN for
    the metrics of sub-steps they skip (TD3's delayed actor step).
    """
    leaves = [jnp.asarray(x) for x in jax.tree.leaves(agent)]
    small = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating) and x.size <= SMALL_ARRAY]
    if not small:
        return jnp.zeros((), bool)
    return jnp.any(jnp.stack([jnp.any(jnp.isnan(x)) for x in small]))


def guarded_update(agent: Any, batch: Any, skip: bool = False) -> tuple[Any, dict, jax.Array]:
    """``agent.update(batch)`` and whether it left a NaN in the agent (``nonfinite``).

    With ``skip`` such an update is discarded: the agent before it is returned (the NaN guard's
    'skip' mode, ``TrainConfig.on_nonfinite``). Returns ``(agent, info, bad)``.
    """
    new, info = agent.update(batch)
    bad = nonfinite(new)
    if skip:
        new = jax.tree.map(lambda old, n: jnp.where(bad, old, n), agent, new)
    return new, info, bad


def compile_cache(make: Any) -> Any:
    """``n -> make(n)``, made once per ``n`` (one jitted chunk function per chunk length)."""
    fns: dict[int, Any] = {}

    def get(n: int) -> Any:
        if n not in fns:
            fns[n] = make(n)
        return fns[n]

    return get


__all__ = [
    "NONFINITE",
    "SMALL_ARRAY",
    "compile_cache",
    "guarded_update",
    "nonfinite",
    "strongly_typed",
]
