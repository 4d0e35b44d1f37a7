"""Devices: the mesh the loops run on, and where each array of a loop state lives.

Every loop runs on a ``jax.sharding.Mesh`` with two axes (a mesh of one device by default):

- ``members``: the seeds x settings of a run (``--num-seeds``, ``jaxrl sweep``). Each device
  holds whole members and computes them on its own; nothing is communicated.
- ``data``: one member's work split across devices. A JAX env's copies are split across
  devices (``--num-envs`` divides by the axis); the replay buffer's rows are split across
  devices, so each device stores 1/N of them; every minibatch is split across devices
  (``jaxrl.buffers.split_rows``), so each device computes the losses and gradients of batch/N
  rows.

The program is the single-device program with shardings on its arrays: XLA's partitioner
inserts the collectives those shardings imply (the gradient all-reduce where a loss averages
over a split batch, the reduction of an observation normalizer's statistics over the split
envs), and the numbers are those of one device up to the order of float sums. So a
checkpoint holds the same arrays at every device count and restores on any other.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl.buffers import DATA, MEMBERS
from jaxrl.errors import ConfigError
from jaxrl.registry import AgentSpec


def parse_devices(devices: str | int) -> int | None:
    """``--devices``: a positive count, or None for ``all``.

    Raises:
        ConfigError: anything else.
    """
    text = str(devices).strip().lower()
    if text == "all":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(f"--devices {devices!r}: give a positive number of devices, or 'all'.")


def available_devices(devices: str | int) -> list[jax.Device]:
    """The first ``devices`` of ``jax.devices()`` (every process's, once distributed).

    Raises:
        ConfigError: more devices than there are, with how to get more on a CPU.
    """
    every = jax.devices()
    count = parse_devices(devices)
    if count is None:
        return every
    if count > len(every):
        platform = every[0].platform
        hint = (
            " On a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N (set before Python "
            "starts) splits it into N devices."
            if platform == "cpu"
            else ""
        )
        raise ConfigError(
            f"--devices {count}: only {len(every)} {platform} device(s) are visible; use "
            f"--devices {len(every)} or --devices all.{hint}"
        )
    return every[:count]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh of ``members x data`` devices, and the shardings of the loops' arrays on it."""

    mesh: Mesh

    @property
    def members(self) -> int:
        """Devices along the members axis."""
        return int(self.mesh.shape[MEMBERS])

    @property
    def data(self) -> int:
        """Devices along the data axis (1: no data parallelism)."""
        return int(self.mesh.shape[DATA])

    def sharding(self, *spec: str | None) -> NamedSharding:
        """``NamedSharding(mesh, PartitionSpec(*spec))``."""
        return NamedSharding(self.mesh, P(*spec))

    def active(self) -> Any:
        """The context to trace the loops' programs in (``jax.set_mesh``).

        Inside it, ``jaxrl.buffers.split_rows`` splits minibatches over the data axis.
        """
        return jax.set_mesh(self.mesh)

    def traced(self, fn: Any) -> Any:
        """``fn`` (a jitted function) called, and so traced, inside ``active()``.

        Only the loops' compiled programs run under the mesh: eager work between them (saving
        one member's arrays) stays outside it.
        """

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.active():
                return fn(*args, **kwargs)

        return call

    def stacked(self, tree: Any, split: Any = None) -> Any:
        """Shardings of a state with a leading member axis.

        Args:
            tree: the state (arrays, or anything with ``.shape``).
            split: a pytree prefix of ``tree`` of ints (None or 0: nothing): in that subtree,
                the leaves whose axis after the member axis has this size are split over the
                data axis (env copies, buffer rows), when the data axis divides it.
        """

        def one(size: int | None, subtree: Any) -> Any:
            def leaf(x: Any) -> NamedSharding:
                shape = np.shape(x)
                if not shape:
                    return self.sharding()
                members = MEMBERS if shape[0] % self.members == 0 else None
                if size and len(shape) > 1 and shape[1] == size and size % self.data == 0:
                    return self.sharding(members, DATA if self.data > 1 else None)
                return self.sharding(members)

            return jax.tree.map(leaf, subtree)

        if split is None:
            return one(0, tree)
        return jax.tree.map(one, split, tree, is_leaf=lambda x: x is None or isinstance(x, int))

    def place(self, tree: Any, shardings: Any) -> Any:
        """``tree`` moved to ``shardings`` (a pytree of them, or one for every leaf).

        With several processes, every process passes the same values (each keeps its
        devices' part). Typed PRNG keys move as their key data.
        """
        if isinstance(shardings, NamedSharding):
            shardings = jax.tree.map(lambda _: shardings, tree)

        def move(x: Any, sharding: NamedSharding) -> Any:
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                # Spread over several processes already (e.g. restored by orbax): resharded
                # by a program, since not every backend moves arrays between hosts directly.
                return jax.jit(lambda y: y, out_shardings=sharding)(x)
            if jax.process_count() > 1 and isinstance(x, jax.Array):
                # This process's copy (every process holds the same): as host data, which
                # device_put spreads to this process's devices of the sharding.
                x = np.asarray(x)
            return jax.device_put(x, sharding)

        def put(x: Any, sharding: NamedSharding) -> Any:
            if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                data = move(jax.random.key_data(x), sharding)
                return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
            return move(x, sharding)

        return jax.tree.map(put, tree, shardings)


def member(tree: Any, i: int) -> Any:
    """Member ``i`` of a state with a leading member axis, where its devices hold it.

    ``x[i]`` would be a program of its own, run on every device, whose result XLA may gather
    with a collective; two such programs in flight at once can wait for each other's devices.
    Here each device that holds member ``i`` slices its own block, with no collective.
    """

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding):
            return x[i]
        mesh, spec = x.sharding.mesh, tuple(x.sharding.spec) + (None,) * x.ndim
        per = x.shape[0] // mesh.shape[MEMBERS] if spec[0] == MEMBERS else x.shape[0]
        group = i // per if spec[0] == MEMBERS else 0
        devices = mesh.devices[group : group + 1]
        sub = NamedSharding(Mesh(devices, mesh.axis_names), P(*spec[1 : x.ndim]))
        mine = set(devices.flat)
        blocks = [
            s.data[i - (s.index[0].start or 0)] for s in x.addressable_shards if s.device in mine
        ]
        return jax.make_array_from_single_device_arrays(x.shape[1:], sub, blocks)

    return jax.tree.map(one, tree)


def primary() -> bool:
    """Whether this process writes the run directory: process 0 (the only one, usually)."""
    return jax.process_index() == 0


def replica_checksum(tree: Any) -> str:
    """Check that every device of every process holds the same copy of ``tree``; its checksum.

    For a run over several processes, whose agent is whole on every device: a device whose
    copy drifted (which the program's all-reduces should make impossible) would train on
    other parameters unseen. Each device's copy is hashed on its host and the hashes are
    gathered once.

    Returns:
        ``every device holds the agent <checksum>.``

    Raises:
        RuntimeError: the copies differ, naming the processes.
    """
    import hashlib

    hashes = []
    for device in jax.local_devices():
        h = hashlib.sha256()
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
                leaf.dtype, jax.dtypes.prng_key
            ):
                leaf = jax.random.key_data(leaf)
            if not isinstance(leaf, jax.Array):
                h.update(np.asarray(leaf).tobytes())
                continue
            for shard in leaf.addressable_shards:
                if shard.device == device:
                    h.update(np.asarray(shard.data).tobytes())
        hashes.append(np.frombuffer(h.digest()[:8], np.uint32))
    local = np.stack(hashes)  # [local devices, 2]
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(local))
    else:
        every = local[None]
    every = every.reshape(jax.process_count(), -1, 2)
    differ = sorted({p for p in range(every.shape[0]) if (every[p] != every[0, 0]).any()})
    if differ:
        raise RuntimeError(
            f"The devices hold different copies of the agent (processes {differ} differ from "
            "process 0's first device): the data-parallel program is inconsistent."
        )
    return "every device holds the agent " + "".join(f"{int(v):08x}" for v in every[0, 0]) + "."


def host_array(x: Any) -> np.ndarray:
    """``x`` as a numpy array on this host, also when other processes hold parts of it."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def make_layout(devices: str | int, members: int) -> Layout:
    """The mesh of ``devices`` for a run of ``members`` members.

    The members axis takes the largest share of the devices that divides the number of
    members (8 members on 4 devices: 4 x 1, two members per device); the rest form the data
    axis (1 member on 4 devices: 1 x 4; 2 members on 4 devices: 2 x 2).
    """
    chosen = available_devices(devices)
    n = len(chosen)
    m = max(d for d in range(1, n + 1) if n % d == 0 and members % d == 0)
    m = math.gcd(m, n)
    grid = np.array(chosen, dtype=object).reshape(m, n // m)
    return Layout(Mesh(grid, (MEMBERS, DATA)))


def check_data_parallel(spec: AgentSpec, layout: Layout, what: str, **sizes: int) -> None:
    """Refuse a data-parallel run that cannot be split.

    That is an agent the registry keeps whole (``AgentSpec.data_parallel``), or ``sizes``
    (e.g. ``num_envs=64``) that the data axis does not divide.

    Raises:
        ConfigError: naming the agent or the size, and what to pass instead.
    """
    if layout.data == 1:
        return
    spec.check_data_parallel(layout.data)
    what = f"{what} with {spec.name}"
    for name, size in sizes.items():
        if size % layout.data:
            fits = [d for d in range(1, layout.data + 1) if size % d == 0]
            raise ConfigError(
                f"{what}: {name} = {size} does not split over {layout.data} devices; make it "
                f"a multiple of {layout.data}, or use --devices {max(fits)} (or a number of "
                "seeds the devices divide, so that each device trains whole seeds)."
            )


__all__ = [
    "COLLECTIVES",
    "DATA",
    "MEMBERS",
    "Layout",
    "available_devices",
    "check_data_parallel",
    "collectives",
    "make_layout",
    "member",
    "host_array",
    "parse_devices",
    "primary",
    "replica_checksum",
]


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
"""The cross-device operations XLA may emit (``collectives`` counts them)."""

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
_BYTES |= {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def collectives(hlo_text: str) -> dict[str, list[int]]:
    """The collectives of a compiled program: ``{kind: [bytes of each op's result]}``.

    ``hlo_text`` is ``jax.jit(f).lower(...).compile().as_text()``. Each op is counted once
    as written in the program, so an op in a loop body (``lax.scan``) counts once however many
    times the loop runs; asynchronous pairs (``all-reduce-start``/``-done``) count once.
    """
    found: dict[str, list[int]] = {kind: [] for kind in COLLECTIVES}
    for line in hlo_text.splitlines():
        for kind in COLLECTIVES:
            marker = next((m for m in (f" {kind}(", f" {kind}-start(") if m in line), None)
            if marker is None or "=" not in line:
                continue
            result = line.split("=", 1)[1].split(marker)[0]
            size = 0
            for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", result):
                count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
                size += count * _BYTES.get(dtype, 4)
            found[kind].append(size)
    return found
