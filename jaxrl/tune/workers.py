"""The one way sweeps start worker processes: a pool of fresh ``spawn`` processes.

Grid members on Gymnasium envs (``jaxrl.tune.grid``) and Optuna's parallel workers
(``jaxrl.tune.optuna_search``) both run here: ``run_pool(fn, jobs)`` calls a public, importable
function on one dataclass per job in at most ``workers`` processes at once. ``spawn`` starts
each process fresh (JAX never forks), and the children import the same ``jaxrl`` as this
process, because ``spawn`` hands them this process's ``sys.path``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Job = TypeVar("Job")


def pool_size(workers: int | None, jobs: int) -> int:
    """Processes at once: ``workers`` (default: the number of cores), at most one per job."""
    return max(1, min(workers or os.cpu_count() or 1, jobs))


def run_pool(
    fn: Callable[[Job], Any], jobs: Sequence[Job], workers: int | None = None
) -> list[Any]:
    """Run ``fn(job)`` for every job in fresh ``spawn`` processes; return results in job order.

    Args:
        fn: a module-level function (the children import it by name), e.g.
            ``jaxrl.run.train.train_job``.
        jobs: its arguments, one picklable dataclass per call.
        workers: processes at once (default: the number of cores).

    Returns:
        ``fn``'s results, in the order of ``jobs``. A job's exception is raised here.
    """
    if not jobs:
        return []
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(pool_size(workers, len(jobs)), mp_context=ctx)
    try:
        futures = [pool.submit(fn, job) for job in jobs]
        return [f.result() for f in futures]
    except KeyboardInterrupt:  # the workers got the same Ctrl-C: let them save and stop
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


__all__ = ["pool_size", "run_pool"]
