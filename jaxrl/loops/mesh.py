"""Devices: the mesh the loops run on, and where each array of a loop state lives.

Every loop runs on a ``jax.sharding.Mesh`` with two axes (a mesh of one device by default):

- ``members``: the seeds x settings of a run (``--num-seeds``, ``jaxrl sweep``). Each device
  holds whole members and computes them on its own; nothing is communicated.
- ``data``: one member's work split across devices. A JAX env's copies are split across
  devices (``--num-envs`` divides by the axis); the replay buffer's rows are split across
  devices, so each device stores 1/N of them; every minibatch is split across devices
  (``Layout.rows``), so each device computes the losses and gradients of batch/N rows.

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

from jaxrl.errors import ConfigError
from jaxrl.sharding import DATA, MEMBERS


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

        Inside it, ``jaxrl.sharding.split_rows`` splits minibatches over the data axis.
        """
        return jax.set_mesh(self.mesh)

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
        """``tree`` moved to ``shardings`` (``jax.device_put``); typed PRNG keys included."""
        return jax.device_put(tree, shardings)


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


def check_data_parallel(layout: Layout, what: str, **sizes: int) -> None:
    """Refuse a data axis that does not divide ``sizes`` (e.g. ``num_envs=64``).

    Raises:
        ConfigError: naming the size and the device counts that divide it.
    """
    if layout.data == 1:
        return
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
    "parse_devices",
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
