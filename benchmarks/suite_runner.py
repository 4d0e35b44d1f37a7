"""Runs the suite's commands (``benchmarks/suite.py``), one at a time or several at once.

Each run is a child process. ``--workers N`` keeps N of them going: on 2 CPU cores two small
runs side by side did 1.39x the env steps per second of one alone (sac-fast on Hopper-v5: 46
env steps/s alone, 32 + 32 side by side), since a 256-wide network keeps neither core busy. A
run's dataset recipe, when only its archive is here, is remade first by the same worker; no two
workers take the same run, and a run another process is training (its run directory's lock is
held: ``jaxrl.loops.config.run_dir_in_use``) is left to it. A stop signal reaches every child,
each of which saves a checkpoint and exits; the suite then exits 130.

With several workers, each worker's children run on their own share of the cores (CPU
affinity, set as a child starts). torch and XLA size their thread pools by the cores a process
may use, so two runs side by side no longer each start a pool for every core: torch's
spin-waiting threads made an oversubscribed d3rlpy PRDC 2.8x slower (3.8 updates/s with 2
threads against 10.5 with 1, beside two other runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stop(Exception):
    """The suite was asked to stop (SIGINT / SIGTERM); the current runs saved their state."""


class Runner:
    """Starts the runs' commands and forwards a stop signal to every one still running."""

    def __init__(self, root: str, log: Callable[[str], None]):
        self.root, self.log = root, log
        self.cpus: list[list[int]] = []  # each worker's cores (``share_cores``); empty: all
        self.children: set[subprocess.Popen] = set()
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def stop(self, _signum: int, _frame: object) -> None:
        """The signal handler (main thread): every child saves a checkpoint and exits."""
        self.stopping.set()
        with self._lock:
            for child in self.children:
                child.send_signal(signal.SIGTERM)

    def share_cores(self, workers: int) -> None:
        """Give each of ``workers`` workers its own cores, when there are enough to go round."""
        cores = sorted(os.sched_getaffinity(0))
        self.cpus = [cores[i::workers] for i in range(workers)] if 1 < workers <= len(cores) else []

    def execute(self, run: Any, worker: int = 0) -> int:
        """Run one command to its end (or to a stop); stdout and stderr go to ``DIR.log``.

        The child gets worker ``worker``'s cores before it can start a thread: its affinity is
        set as soon as it exists, while the interpreter is still starting.
        """
        out = os.path.join(self.root, run.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.log(f"start {run.name}")
        t0 = time.time()
        with open(out + ".log", "a") as f:
            f.write(f"\n$ {' '.join(run.command(self.root))}\n")
            f.flush()
            with self._lock:
                if self.stopping.is_set():
                    raise Stop
                child = subprocess.Popen(
                    run.command(self.root), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT
                )
                if self.cpus:
                    os.sched_setaffinity(child.pid, self.cpus[worker])
                self.children.add(child)
            try:
                rc = child.wait()
            finally:
                with self._lock:
                    self.children.discard(child)
        self.log(f"end {run.name} rc={rc} {time.time() - t0:.0f}s")
        if self.stopping.is_set():
            raise Stop
        return rc


def run_queue(
    chosen: list[Any],
    state: Callable[[Any], tuple[str, str]],
    remake: Callable[[Any], list[Any]],
    finish: Callable[[Any, int], bool],
    runner: Runner,
    workers: int = 1,
    max_runs: int | None = None,
    prepare: Callable[[Any], None] | None = None,
) -> int:
    """Run every unfinished run of ``chosen``, in order, ``workers`` at a time.

    Args:
        chosen: the runs, in the order they are taken.
        state: ``run -> (state, detail)`` (``suite_state.state``; "pending", "partial" and "stale"
            are run).
        remake: ``run -> the runs to redo here first`` (its archived-only dataset recipe).
        finish: called after each command with its exit code; True when the run finished
            (archived and reported), False to skip the rest of that job.
        runner: starts the commands.
        workers: how many commands at once.
        max_runs: start at most this many runs (not counting remade needs).
        prepare: called with each run just before its command starts (``suite.py`` moves a
            stale run's old directory aside there).

    Returns:
        0; 130 when a stop signal ended the suite; 1 when starting or finishing a run raised
        (the traceback is logged, and the other runs are stopped, their state saved).
    """
    cond = threading.Condition()
    errors: list[str] = []  # runs whose worker raised (``work``)
    busy: set[str] = set()
    said: set[str] = set()
    started = [0]

    def say_once(name: str, msg: str) -> None:
        if name not in said:
            said.add(name)
            runner.log(msg)

    def take() -> tuple[Any, list[Any]] | str | None:
        """The next free job, "wait" (another worker may free one), or None (all done)."""
        for run in chosen:
            if run.name in busy:
                continue
            st, detail = state(run)
            if st in ("blocked", "no-venv", "running"):
                say_once(run.name, f"skip {run.name}: {detail}")
            if st not in ("pending", "partial", "stale"):
                continue
            todo = remake(run)
            if any(t.name in busy for t in todo):
                continue  # its dataset is being remade by another worker
            if max_runs is not None and started[0] >= max_runs:
                break
            started[0] += 1
            busy.update(t.name for t in (*todo, run))
            return run, todo
        return "wait" if busy else None

    def work(worker: int) -> None:
        while not runner.stopping.is_set():
            with cond:
                job = take()
                while job == "wait" and not runner.stopping.is_set():
                    cond.wait(timeout=1.0)
                    job = take()
            if not isinstance(job, tuple):
                return
            run, todo = job
            try:
                for each in (*todo, run):
                    if prepare is not None:
                        prepare(each)
                    if not finish(each, runner.execute(each, worker)):
                        break
            except Stop:
                return
            except Exception:  # a bug in the suite itself: say so and stop the other runs
                runner.log(f"error while running {run.name}:\n{traceback.format_exc()}")
                errors.append(run.name)
                runner.stop(signal.SIGTERM, None)
                return
            finally:
                with cond:
                    busy.difference_update(t.name for t in (*todo, run))
                    cond.notify_all()

    old = {s: signal.signal(s, runner.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        runner.share_cores(workers)
        threads = [
            threading.Thread(target=work, args=(i,), daemon=True) for i in range(max(workers, 1))
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # a timed join: the main thread keeps taking signals
                t.join(timeout=0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if errors:
        runner.log(f"stopped by an error while running {', '.join(errors)} (see above)")
        return 1
    if runner.stopping.is_set():
        runner.log("stopped: rerun the same command to continue")
        return 130
    return 0
