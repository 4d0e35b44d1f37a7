"""Device-resident replay buffer as pure functions over an explicit state (optax / flashbax style).

```python
buf = make_replay_buffer(capacity=100_000)
state = buf.init(example_transition)          # one unbatched Transition
state = buf.add(state, transitions)           # leading axis = number of new rows
batch = buf.sample(state, key, batch_size)    # Transition with leading axis batch_size
```

Everything works inside ``jit``, ``lax.scan`` and ``vmap``. Pass the state as a donated argument of
the jitted step so that ``add`` writes in place instead of copying the whole buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec as P


class BufferState(struct.PyTreeNode):
    """Replay storage: ``data`` has a leading ``capacity`` axis on every leaf.

    Attributes:
        data: pytree (usually a ``Transition``) of ``[capacity, ...]`` arrays.
        pos: next row to write (int32 scalar).
        size: number of valid rows (int32 scalar), at most ``capacity``.
    """

    data: Any
    pos: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        """Number of rows the buffer holds."""
        return jax.tree.leaves(self.data)[0].shape[0]


class ReplayBuffer(NamedTuple):
    """The pure functions of a replay buffer (see module docstring)."""

    init: Callable[[Any], BufferState]
    add: Callable[[BufferState, Any], BufferState]
    sample: Callable[[BufferState, jax.Array, int], Any]


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def buffer_add(state: BufferState, items: Any) -> BufferState:
    """Append rows (leading axis ``n <= capacity``), overwriting the oldest rows when full."""
    n = jax.tree.leaves(items)[0].shape[0]
    capacity = state.capacity
    if n > capacity:
        raise ValueError(f"Cannot add {n} rows at once to a buffer of capacity {capacity}.")
    idx = (state.pos + jnp.arange(n)) % capacity
    data = jax.tree.map(lambda d, x: d.at[idx].set(x.astype(d.dtype)), state.data, items)
    return BufferState(
        data=data,
        pos=((state.pos + n) % capacity).astype(jnp.int32),
        size=jnp.minimum(state.size + n, capacity).astype(jnp.int32),
    )


def buffer_sample(state: BufferState, key: jax.Array, batch_size: int) -> Any:
    """Sample ``batch_size`` valid rows uniformly with replacement (needs a non-empty buffer)."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
    return buffer_gather(state, idx)


def buffer_gather(state: BufferState, rows: jax.Array) -> Any:
    """The rows ``rows`` (an integer array of any shape, which leads every returned leaf)."""
    return jax.tree.map(lambda d: d[rows], state.data)


def make_replay_buffer(capacity: int) -> ReplayBuffer:
    """Build a uniform replay buffer holding up to ``capacity`` rows.

    Raises:
        ValueError: if ``capacity`` is not a positive integer.
    """
    capacity = _check_positive_int("capacity", capacity)

    def init(example: Any) -> BufferState:
        data = jax.tree.map(
            lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
        )
        return BufferState(data=data, pos=jnp.int32(0), size=jnp.int32(0))

    def sample(state: BufferState, key: jax.Array, batch_size: int) -> Any:
        return buffer_sample(state, key, batch_size)

    return ReplayBuffer(init=init, add=buffer_add, sample=sample)


def buffer_from_arrays(data: Any) -> BufferState:
    """A full buffer state holding ``data`` (a pytree of ``[N, ...]`` arrays, e.g. a dataset)."""
    leaves = jax.tree.leaves(data)
    if not leaves:
        raise ValueError("buffer_from_arrays needs at least one array.")
    n = leaves[0].shape[0]
    for leaf in leaves:
        if leaf.shape[0] != n:
            raise ValueError(f"All arrays must have the same length; got {n} and {leaf.shape[0]}.")
    data = jax.tree.map(jnp.asarray, data)
    return BufferState(data=data, pos=jnp.int32(0), size=jnp.int32(n))


def sample_mixed(
    state_a: BufferState, state_b: BufferState, key: jax.Array, batch_size: int, ratio_a: float
) -> Any:
    """Sample ``round(ratio_a * batch_size)`` rows from ``state_a`` and the rest from ``state_b``.

    This is the symmetric sampling of RLPD (Ball et al., 2023) when ``ratio_a = 0.5``.
    """
    if not 0.0 <= ratio_a <= 1.0:
        raise ValueError(f"ratio_a must be in [0, 1], got {ratio_a}.")
    n_a = int(round(ratio_a * batch_size))
    key_a, key_b = jax.random.split(key)
    parts = []
    if n_a > 0:
        parts.append(buffer_sample(state_a, key_a, n_a))
    if batch_size - n_a > 0:
        parts.append(buffer_sample(state_b, key_b, batch_size - n_a))
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)


def sample_minibatches(
    state: BufferState,
    key: jax.Array,
    num_batches: int,
    batch_size: int,
    prior: BufferState | None = None,
    prior_ratio: float = 0.0,
) -> Any:
    """``num_batches`` minibatches, leading axes ``[num_batches, batch_size]``, for ``lax.scan``.

    With ``prior`` (e.g. an offline dataset) every minibatch holds ``round(prior_ratio *
    batch_size)`` rows of ``prior`` followed by the rest from ``state`` (``sample_mixed``), so the
    ratio holds per gradient step, not just on average.
    """
    if prior is None or prior_ratio == 0.0:
        flat = buffer_sample(state, key, num_batches * batch_size)
        return jax.tree.map(lambda x: x.reshape(num_batches, batch_size, *x.shape[1:]), flat)
    keys = jax.random.split(key, num_batches)
    return jax.vmap(lambda k: sample_mixed(prior, state, k, batch_size, prior_ratio))(keys)


def set_rows(state: BufferState, field: str, rows: jax.Array, values: jax.Array) -> BufferState:
    """``state`` with ``data.<field>[rows] = values``; out-of-range rows are dropped.

    For fields known only after the step was added (``next_action``, ``mc_return``).
    """
    column = getattr(state.data, field).at[rows].set(values, mode="drop")
    return state.replace(data=state.data._replace(**{field: column}))


# ------------------------------------------------------------------------ sequences of steps


def sequence_rows(state: Any, offsets: Any, length: int, stride: int, xp: Any = jnp) -> Any:
    """Buffer rows of sequences that start ``offsets`` rows after the oldest row.

    A step of one env is ``stride`` rows after its previous step (``num_envs`` when each loop
    step writes one row per env), so sequence ``i`` is rows ``oldest + offsets[i] + stride * k``,
    ``k < length`` (modulo the capacity). ``state`` is a ``BufferState`` or anything with
    ``pos``, ``size`` and ``capacity``; ``xp`` is ``jax.numpy`` or ``numpy`` (the host loop
    draws rows on the host).

    Returns:
        Integer rows of shape ``offsets.shape + (length,)``.
    """
    capacity = state.capacity
    oldest = (state.pos - state.size) % capacity
    steps = xp.arange(length) * stride
    return (oldest + offsets[..., None] + steps) % capacity


def sequence_offsets_bound(size: Any, length: int, stride: int, xp: Any = jnp) -> Any:
    """How many start offsets have a whole sequence written after them (at least 1)."""
    return xp.maximum(size - stride * (length - 1), 1)


def pick_sequences(state: BufferState, rows: jax.Array, batch_size: int) -> Any:
    """``batch_size`` sequences among candidate ``rows`` (``[..., candidates, length]``).

    A candidate is kept when each step's ``next_obs`` is the following step's ``obs``: the
    sequence stays inside one episode (after an episode end the next row holds a reset
    observation) and never runs into rows the buffer overwrote. The first ``batch_size`` kept
    candidates are returned; when fewer are kept, kept ones repeat (all of them when none is,
    which happens only before enough steps were stored).

    Returns:
        The data with leading axes ``[..., batch_size, length]``.
    """

    def pick(rows: jax.Array) -> Any:
        obs, next_obs = state.data.obs, state.data.next_obs
        same = next_obs[rows[:, :-1]] == obs[rows[:, 1:]]
        valid = jnp.all(same.reshape(*rows.shape[:1], -1), axis=-1)
        order = jnp.argsort(~valid, stable=True)
        count = jnp.maximum(jnp.sum(valid), 1)
        chosen = rows[order[jnp.arange(batch_size) % count]]
        return buffer_gather(state, chosen)

    flat = rows.reshape(-1, *rows.shape[-2:])
    out = jax.vmap(pick)(flat)
    return jax.tree.map(lambda x: x.reshape(*rows.shape[:-2], *x.shape[1:]), out)


def sample_sequences(
    state: BufferState,
    key: jax.Array,
    num_batches: int,
    batch_size: int,
    length: int,
    stride: int = 1,
    oversample: int = 2,
) -> Any:
    """``num_batches`` minibatches of ``batch_size`` sequences of ``length`` consecutive steps.

    Starts are drawn uniformly among the rows with a whole sequence written after them
    (``oversample * batch_size`` candidates per minibatch) and kept by ``pick_sequences``.
    Cost: O(rows gathered), independent of the capacity.

    Returns:
        The data with leading axes ``[num_batches, batch_size, length]``.
    """
    shape = (num_batches, oversample * batch_size)
    bound = sequence_offsets_bound(state.size, length, stride)
    offsets = jax.random.randint(key, shape, 0, bound)
    return pick_sequences(state, sequence_rows(state, offsets, length, stride), batch_size)


# ---------------------------------------------- minibatch rows over the devices of a mesh
# An agent that forms its own minibatches (PPO's shuffled segments) calls ``split_rows`` on them,
# as the loops do on the minibatches they sample. It does nothing unless a loop traces under a
# mesh with a data axis of several devices (``jax.set_mesh``; ``jaxrl.loops.mesh``), so an
# agent is the same code on one device and on many.

MEMBERS = "members"
"""Mesh axis of the members (seeds x settings): no communication across it."""
DATA = "data"
"""Mesh axis of one member's envs, buffer rows and minibatch rows."""


def data_devices() -> int:
    """Devices along the data axis of the mesh being traced under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA not in mesh.axis_names:
        return 1
    return int(dict(mesh.shape)[DATA])


def split_rows(tree: Any, axis: int = 0) -> Any:
    """``tree`` with axis ``axis`` of every leaf split over the data axis' devices.

    Each device then computes the losses of its rows, and XLA sums the gradients over the
    devices with one all-reduce (the mean over the rows is a sum across devices). Under
    ``jax.vmap(..., spmd_axis_name=MEMBERS)`` the members axis goes in front. Without a data
    axis of several devices, ``tree`` is returned as it is.
    """
    if data_devices() == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, P(*([None] * axis), DATA))
