"""Joining several processes (hosts) into one run with ``jax.distributed``.

Each process drives its own devices; together they form the mesh that ``--devices all``
spans (``jaxrl.loops.mesh``). ``start_processes`` must run before JAX touches a device.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from jaxrl.errors import ConfigError

CLUSTER_TASKS = {"SLURM_NTASKS": "SLURM", "OMPI_COMM_WORLD_SIZE": "Open MPI"}
"""Environment variables that give the number of tasks of a cluster job JAX can join itself."""


def cluster_tasks() -> tuple[str, int] | None:
    """``(scheduler, tasks)`` of a cluster job with several tasks, or None."""
    for var, name in CLUSTER_TASKS.items():
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            return name, int(value)
    return None


def start_processes(cfg: Any) -> bool:
    """Join the processes of a run, if it has several; True when they were joined.

    With ``cfg.coordinator`` (and ``num_processes``, ``process_id``) every process calls
    ``jax.distributed.initialize`` with them. Without, inside a cluster job with several
    tasks (SLURM, Open MPI), JAX reads the coordinator and the process's index from the
    cluster's environment. Otherwise nothing happens: one process.

    Raises:
        ConfigError: the processes could not meet (the coordinator's address, or a process
            that did not start), with what to check.
    """
    if jax.distributed.is_initialized():
        return True
    cluster = cluster_tasks()
    if cfg.coordinator is None and cluster is None:
        return False
    where = f"the coordinator {cfg.coordinator}" if cfg.coordinator else f"the {cluster[0]} job"
    try:
        if cfg.coordinator is not None:
            jax.distributed.initialize(
                coordinator_address=cfg.coordinator,
                num_processes=cfg.num_processes,
                process_id=cfg.process_id,
            )
        else:
            jax.distributed.initialize()
    except (RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"Could not join the other processes through {where} ({first}). Start every "
            "process with the same --coordinator HOST:PORT and --num-processes, each with its "
            "own --process-id, and check that process 0's host and port are reachable."
        ) from None
    return True


__all__ = ["CLUSTER_TASKS", "cluster_tasks", "start_processes"]
