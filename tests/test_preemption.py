"""Preemption: `kill -9` during training, then the same command again, ends bit-identical.

For each loop (host, fused, offline, offline-to-online) a tiny `jaxrl train` runs in a
subprocess, is killed with SIGKILL at points drawn from a fixed seed, and is resumed with the same
command each time; the finished run must equal an uninterrupted one in every non-timing column of
``metrics.csv``, in ``summary.json`` and in the whole final training state (agent, optimizer,
buffer, RNGs, env state and the checkpoint's host-side record), leaf by leaf and exactly.

A kill point is a step and a place, so the test is deterministic. The killed process stops
itself there (SIGSTOP, from hooks installed by ``_CHILD`` before it runs the real command line),
and the test sends the SIGKILL:

- ``step``: a step (a chunk, offline) has been computed and counted but not yet logged or saved;
- ``log``: a metrics row is written, the checkpoint of that step is not (``metrics.csv`` runs
  ahead of the checkpoints and must be cut back on resume);
- ``save``: a checkpoint has been written to orbax's temporary directory but not renamed into
  place (killed mid-write: the previous checkpoint must be the one that resumes).

Seven kills in all: two in the host loop, two in the fused loop (offline, then online on a JAX
env with the dataset in its minibatches), one in the offline loop and two in offline-to-online
on a Gymnasium env (one per phase's step range each). Checkpoints are written every few log
points, so every resume restarts before the kill and has to redo steps; the test checks that
each run resumed from the newest complete checkpoint. A persistent compilation cache shared by the
subprocesses keeps each one to a few seconds of CPU after the first of its loop.
"""

from __future__ import annotations

import csv
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest

from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.run.runs import load_run

# 14 subprocesses of `jaxrl train` (4 uninterrupted, 7 killed, 3 resumed to the end): about
# 160 s of CPU, so 1-3 minutes on 2 cores.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILL_SEED = 19  # the kill points are drawn from this seed
PLACES = ("step", "log", "save")
TIMEOUT = 300  # seconds for one subprocess: far above the few seconds each takes

# Installs the stop points, then runs `jaxrl train ...` (sys.argv[1:]) like the console script.
# The hooks wrap the code they observe and change nothing else: a process without KILL_AT runs
# unhooked. The step every place compares is the run directory's row and checkpoint numbering
# (offline gradient steps + env steps in an offline-to-online run).
_CHILD = r"""
import os, signal, sys

at, place = os.environ.get("KILL_AT"), os.environ.get("KILL_PLACE")


def stop(step):
    with open(os.environ["KILL_RECORD"], "w") as f:
        f.write(f"{place} {step}\n")
    os.kill(os.getpid(), signal.SIGSTOP)  # the test sends SIGKILL


if at is not None:
    at = int(at)
    if place == "step":
        from jaxrl.loops.harness import Harness

        advance = Harness.advance

        def hooked_advance(self, *args, **kwargs):
            points = advance(self, *args, **kwargs)
            if self.step_offset + self.step >= at:
                stop(self.step_offset + self.step)
            return points

        Harness.advance = hooked_advance
    elif place == "log":
        from jaxrl.loops.logging import RunLogger

        log = RunLogger.log

        def hooked_log(self, step, *args, **kwargs):
            log(self, step, *args, **kwargs)
            if step >= at:
                stop(step)

        RunLogger.log = hooked_log
    elif place == "save":
        from orbax.checkpoint._src.path import atomicity

        from jaxrl.loops.checkpoint import Checkpointer

        save, finalize, saving = Checkpointer.save, atomicity.AtomicRenameTemporaryPath.finalize, []

        def hooked_save(self, step, *args, **kwargs):
            saving[:] = [step]
            try:
                save(self, step, *args, **kwargs)
            finally:
                saving.clear()

        async def hooked_finalize(self, *args, **kwargs):
            # The state item and the checkpoint directory are renamed in turn; stop before the
            # checkpoint's own rename, when everything is on disk under a temporary name.
            if saving and saving[0] >= at and self.get_final().name == str(saving[0]):
                stop(saving[0])
            return await finalize(self, *args, **kwargs)

        Checkpointer.save = hooked_save
        atomicity.AtomicRenameTemporaryPath.finalize = hooked_finalize
    else:
        raise SystemExit(f"unknown KILL_PLACE {place!r}")

from jaxrl.cli import main

main(sys.argv[1:])
"""

TINY = ["--hidden-dims", "16", "16", "--batch-size", "16", "--buffer-size", "1000"]
COMMON = ["--no-progress", "--no-tensorboard", "--seed", "3"]

# name -> (command line without --out, last row step, kill-step ranges: one kill in each range).
# Checkpoints every 2-4 log points; the ranges are wide so the drawn steps land anywhere,
# including before the first checkpoint and (offline-to-online) in either phase.
CASES = {
    "host": (
        ["td3", "--env", "InvertedPendulum-v5", "--total-steps", "300", "--learning-starts",
         "100", "--log-every", "20", "--checkpoint-every", "70", "--eval-every", "150",
         "--eval-episodes", "1", *TINY],
        300,
        [(1, 150), (150, 300)],
    ),
    # The fused loop: offline, then online on a JAX env with the dataset as a second buffer.
    "fused": (
        ["iql", "--dataset", "{jax_dataset}", "--num-envs", "2", "--offline-steps", "100",
         "--online-steps", "200", "--learning-starts", "64", "--log-every", "20",
         "--checkpoint-every", "60", "--eval-every", "100", "--eval-episodes", "2", *TINY],
        300,
        [(1, 100), (100, 300)],
    ),
    "offline": (
        ["td3-bc", "--dataset", "{dataset}", "--total-steps", "200", "--log-every", "10",
         "--checkpoint-every", "40", "--eval-every", "100", "--eval-episodes", "1", *TINY],
        200,
        [(1, 200)],
    ),
    "offline-to-online": (
        ["iql", "--dataset", "{dataset}", "--offline-steps", "100", "--online-steps", "150",
         "--learning-starts", "50", "--log-every", "10", "--checkpoint-every", "40",
         "--eval-every", "100", "--eval-episodes", "1", *TINY],
        250,
        [(1, 100), (100, 250)],
    ),
}  # fmt: skip


def _kill_points() -> dict[str, list[tuple[int, str]]]:
    """``case -> [(step, place), ...]``, drawn once from ``KILL_SEED``."""
    rng = np.random.default_rng(KILL_SEED)
    points = {}
    for name, (_, _, ranges) in CASES.items():
        points[name] = [(int(rng.integers(lo, hi)), str(rng.choice(PLACES))) for lo, hi in ranges]
    return points


KILL_POINTS = _kill_points()


@pytest.fixture(scope="module")
def child_env(tmp_path_factory):
    """Environment of the subprocesses: this checkout's code and a shared compilation cache."""
    cache = str(tmp_path_factory.mktemp("jax-cache"))
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "JAX_PLATFORMS": "cpu",
        "MUJOCO_GL": "disable",
        "JAX_COMPILATION_CACHE_DIR": cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """300 random InvertedPendulum-v5 transitions (a MuJoCo env, so the online phase is savable)."""
    from jaxrl.data import Dataset, save_d4rl

    n, rng = 300, np.random.default_rng(0)
    obs = rng.normal(0.0, 0.2, (n, 4)).astype(np.float32)
    ds = Dataset(
        observations=obs,
        actions=rng.uniform(-3.0, 3.0, (n, 1)).astype(np.float32),
        rewards=np.ones(n, np.float32),
        next_observations=np.roll(obs, -1, axis=0),
        terminals=np.arange(n) % 30 == 29,
        timeouts=np.zeros(n, bool),
        env_id="InvertedPendulum-v5",
        ref_returns=(0.0, 1000.0),
    )
    return save_d4rl(ds, tmp_path_factory.mktemp("data") / "pendulum-random.hdf5")


@pytest.fixture(scope="module")
def jax_dataset(tmp_path_factory):
    """300 random jax:pendulum transitions, collected as `jaxrl dataset collect` does."""
    from jaxrl.data import save_d4rl
    from jaxrl.run.collect import rollout_jax

    ds = rollout_jax("jax:pendulum", None, 300, 0)
    ds.ref_returns = (-1200.0, -150.0)
    return save_d4rl(ds, tmp_path_factory.mktemp("data") / "jax-pendulum-random.hdf5")


def _train(argv, out, env, log, kill=None):
    """``jaxrl train ARGV --out OUT``; with ``kill = (step, place)``, SIGKILL it there.

    Returns the step at which it was killed (None when it ran to the end) and its output (also
    appended to ``log``).
    """
    args = ["train", *argv, *COMMON, "--out", str(out)]
    env = dict(env)
    if kill is None:
        cmd = [sys.executable, "-m", "jaxrl.cli", *args]
    else:
        cmd = [sys.executable, "-c", _CHILD, *args]
        record = f"{out}.kill"
        env.update(KILL_AT=str(kill[0]), KILL_PLACE=kill[1], KILL_RECORD=record)
    with open(log, "a") as f:
        f.write(f"\n$ jaxrl {' '.join(args)}  # kill at {kill}\n")
        start = f.tell()
        f.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    began = time.monotonic()
    try:
        if kill is None:
            code = proc.wait(TIMEOUT)
            output = _read(log, start)
            assert code == 0, f"`jaxrl train` failed ({code}):\n{output[-3000:]}"
            return None, output
        status = _wait_stopped(proc)
        if status != "stopped":
            output = _read(log, start)[-3000:]
            pytest.fail(f"the run never reached its kill point {kill} ({status}):\n{output}")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(TIMEOUT) == -signal.SIGKILL
        place, step = open(record).read().split()
        os.remove(record)
        assert place == kill[1] and int(step) >= kill[0]
        return int(step), _read(log, start)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with open(log, "a") as f:
            f.write(f"\n# {time.monotonic() - began:.1f} s\n")


def _read(path, start: int) -> str:
    with open(path) as f:
        f.seek(start)
        return f.read()


def _wait_stopped(proc) -> str:
    """Wait until ``proc`` stops itself (SIGSTOP) or exits; ``"stopped"`` or how it ended."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):
            return "stopped"
        if pid:  # exited: hand the status back to Popen, which no longer can reap it
            proc.returncode = os.waitstatus_to_exitcode(status)
            return f"exited with status {proc.returncode}"
        time.sleep(0.05)
    return "timed out"


def _metrics(out) -> list[dict[str, str]]:
    """``metrics.csv`` rows as text, without the empty cells and the timing columns."""
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return [
            {k: v for k, v in row.items() if v != "" and not k.startswith("time/")}
            for row in csv.DictReader(f)
        ]


def _summary(out) -> dict:
    """``summary.json`` without its timing fields."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    for key in ("wall_clock_s", "env_steps_per_s", "updates_per_s"):
        summary.pop(key, None)
    return summary


def _leaves(tree) -> list[np.ndarray]:
    def numeric(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return [numeric(x) for x in jax.tree.leaves(tree)]


def _resumed_from(output: str) -> list[int]:
    """The steps a run said it resumed from (empty: it started anew)."""
    return [int(x) for x in re.findall(r"^Resuming .* from step (\d+)\.$", output, re.M)]


def _first_difference(got: list[dict], want: list[dict]) -> str:
    for a, b in zip(got, want, strict=False):
        if a != b:
            cells = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
            return f"row of step {b.get('step')}: (resumed, uninterrupted) = {cells}"
    return f"{len(got)} rows after the kills, {len(want)} uninterrupted"


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_and_resume_is_bit_identical(
    case, tmp_path, child_env, dataset, jax_dataset, record_property
):
    template, last_step, _ = CASES[case]
    files = {"{dataset}": dataset, "{jax_dataset}": jax_dataset}
    argv = [files.get(a, a) for a in template]
    log = tmp_path / "train.log"
    full, killed = tmp_path / "full", tmp_path / "killed"
    cpu = _children_cpu()
    # The uninterrupted run beside the first killed one: each compiles on its own core (the
    # later runs find the programs in the compilation cache).
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(_train, argv, full, child_env, tmp_path / "full.log")
        ckpts = Checkpointer(killed / "checkpoints")
        newest = None
        for point in KILL_POINTS[case]:
            stopped, output = _train(argv, killed, child_env, log, kill=point)
            assert _resumed_from(output) == ([] if newest is None else [newest])
            # The newest complete checkpoint is older than the kill: the next run redoes steps.
            newest = ckpts.latest_step()
            assert newest is None or newest < stopped, (point, stopped, newest)
            if point[1] == "save":  # killed mid-write: only orbax's temporary directory is there
                names = os.listdir(killed / "checkpoints")
                assert any(n.startswith(f"{stopped}.orbax-checkpoint-tmp") for n in names), names
        _, output = _train(argv, killed, child_env, log)
        assert _resumed_from(output) == ([] if newest is None else [newest])
        reference.result()
    record_property("subprocess_cpu_s", _children_cpu() - cpu)

    want = _metrics(full)
    assert want[-1]["step"] == str(last_step)
    assert {"eval_return", "train/nonfinite_updates"} <= want[-1].keys()
    assert any(k.endswith("/loss") for k in want[-1]), want[-1]
    got = _metrics(killed)
    assert len(got) == len(want) and got == want, _first_difference(got, want)
    assert _summary(killed) == _summary(full)
    assert _summary(full)["completed"]

    a, b = load_run(str(full)), load_run(str(killed))
    # The checkpoints' metadata match but for the wall clock, which adds up every segment.
    a_wall, b_wall = a.meta.pop("wall_clock_s"), b.meta.pop("wall_clock_s")
    assert a.meta == b.meta and a.meta["step"] == b.meta["step"]
    assert json.load(open(killed / "summary.json"))["wall_clock_s"] >= b_wall > 0 < a_wall
    assert Checkpointer(full / "checkpoints").all_steps() == ckpts.all_steps()
    pairs = list(zip(_leaves(a.state), _leaves(b.state), strict=True))
    assert len(pairs) > 10
    for i, (x, y) in enumerate(pairs):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        np.testing.assert_array_equal(x, y, err_msg=f"leaf {i} of the final state differs")
