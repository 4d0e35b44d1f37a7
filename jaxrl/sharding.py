"""The mesh axis names, and splitting minibatch rows over the devices of the data axis.

Pure and loop-free: an agent that forms its own minibatches (PPO's shuffled segments) calls
``split_rows`` on them, as the loops do on the minibatches they sample. It does nothing unless
a loop traces under a mesh with a data axis of several devices (``jax.set_mesh``;
``jaxrl.loops.mesh``), so an agent stays the same code on one device and on many.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

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


__all__ = ["DATA", "MEMBERS", "data_devices", "split_rows"]
