"""Device-side helpers the loops share: strongly typed state, compiled chunks, the NaN guard.

The NaN guard: every loop state carries ``nonfinite``, a device-side count of the updates
after which the agent held a NaN, which ``guarded_update`` (the update call of every loop,
which also applies ``--on-nonfinite skip``) adds to; the harness reads it with the metrics at
log points, as the column ``NONFINITE``, and applies 'stop' and 'warn'.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.buffers import BufferState, sample_minibatches, sample_sequences, split_rows

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


NONFINITE_MODES = ("stop", "skip", "warn")
"""What to do with an update that leaves a NaN in the agent (``TrainConfig.on_nonfinite``)."""


def guarded_update(
    agent: Any, batch: Any, on_nonfinite: str = "stop"
) -> tuple[Any, dict, jax.Array]:
    """``agent.update(batch)`` under the NaN guard: the one place its modes act on an update.

    ``bad`` says whether the update left a NaN in the agent (``nonfinite``). In 'skip' mode
    such an update is discarded (the agent before it is returned: a ``jnp.where`` over the
    agent); 'stop' and 'warn' keep it, at no cost beyond the check, and the harness acts on
    the count (``Harness.log``). Returns ``(agent, info, bad)``.
    """
    if on_nonfinite not in NONFINITE_MODES:  # at trace time: e.g. a function passed by mistake
        raise ValueError(f"on_nonfinite must be one of {NONFINITE_MODES}, got {on_nonfinite!r}.")
    new, info = agent.update(batch)
    bad = nonfinite(new)
    if on_nonfinite == "skip":
        new = jax.tree.map(lambda old, n: jnp.where(bad, old, n), agent, new)
    return new, info, bad


def guarded_updates(
    agent: Any, xs: Any, on_nonfinite: str = "stop", batch: Any = None
) -> tuple[Any, dict[str, jax.Array], jax.Array]:
    """One ``guarded_update`` per element of ``xs`` (leading axis) under ``lax.scan``.

    ``xs`` are the minibatches, or what ``batch(x)`` makes each one from inside the scan (e.g.
    a key to sample it with). Returns the agent, the last update's metrics and how many of the
    updates left a NaN in the agent (int32; in 'skip' mode, the discarded ones).
    """

    def body(agent: Any, x: Any) -> tuple[Any, tuple[dict[str, jax.Array], jax.Array]]:
        agent, info, bad = guarded_update(agent, x if batch is None else batch(x), on_nonfinite)
        return agent, (info, bad)

    agent, (infos, bad) = jax.lax.scan(body, agent, xs)
    return agent, jax.tree.map(lambda x: x[-1], infos), jnp.sum(bad, dtype=jnp.int32)


def update_step(
    agent: Any,
    rng: jax.Array,
    buffer: BufferState,
    prior: BufferState | None,
    *,
    num_updates: int,
    batch_size: int,
    prior_ratio: float = 0.0,
    sequence: tuple[int, int] | None = None,
    on_nonfinite: str = "stop",
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """``num_updates`` guarded gradient steps on minibatches sampled on the device.

    The fused loop's update (the host loop draws its rows on the host, ``host._learn``). With
    ``prior`` (offline data) each minibatch mixes ``prior_ratio`` of its rows from it. With
    ``sequence = (length, stride)`` a minibatch holds runs of ``length`` consecutive steps
    (``sample_sequences``). The returned metrics are the last update's, plus ``NONFINITE``:
    after how many of the updates the agent held a NaN (``guarded_updates``). The minibatches'
    rows are split over the data axis of the mesh, if any (``split_rows``).
    """
    rng, key = jax.random.split(rng)
    if sequence is not None:
        batches = sample_sequences(buffer, key, num_updates, batch_size, *sequence)
    else:
        batches = sample_minibatches(buffer, key, num_updates, batch_size, prior, prior_ratio)
    batches = split_rows(batches, 1)
    agent, info, bad = guarded_updates(agent, batches, on_nonfinite)
    return agent, rng, {**info, NONFINITE: bad}


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
    "NONFINITE_MODES",
    "SMALL_ARRAY",
    "compile_cache",
    "guarded_update",
    "guarded_updates",
    "nonfinite",
    "strongly_typed",
    "update_step",
]
