"""jaxrl's run-directory contract for the peer learning runs (``suite_*.py``).

The peer virtualenvs do not have jaxrl, so this module needs only the standard library. A run
directory written through :class:`RunDir` holds what ``benchmarks/suite.py`` reads from a jaxrl
run: ``config.json``, ``metrics.csv`` (``step,eval_return,eval_return_std``, one row per
evaluation, appended as the run goes), ``summary.json`` at the end, and ``checkpoints/`` with
the peer library's own save files and ``checkpoints/checkpoint.json`` (step, wall clock).

A checkpoint is written into a fresh ``checkpoints/step_<N>/`` folder; only then does
``checkpoint.json`` (written atomically) point at it and the older folders are removed, so a run
killed at any moment resumes from a complete checkpoint. Rows of ``metrics.csv`` past that step
are dropped on resume (they are evaluated again).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

METRICS_HEADER = ("step", "eval_return", "eval_return_std")

# D4RL's reference returns (random policy, SAC expert) per locomotion family (d4rl/infos.py).
D4RL_REF_RETURNS: dict[str, tuple[float, float]] = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}


def add_common_args(p: argparse.ArgumentParser, eval_every: int, eval_episodes: int) -> None:
    """Add the options every peer learning script takes (``--out --seed --eval-every ...``).

    Args:
        p: the script's parser.
        eval_every: default evaluation period (env steps online, gradient steps offline).
        eval_episodes: default number of evaluation episodes.
    """
    p.add_argument("--out", required=True, help="run directory (resumed from its checkpoint)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=eval_every, help="steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=eval_episodes, help="episodes per eval")


def write_json(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary file, then ``os.replace``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """The JSON value in ``path``, or None when the file does not exist."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def gymnasium_refs(env_id: str | None) -> tuple[float, float] | None:
    """D4RL reference returns for a Gymnasium MuJoCo id (``'Hopper-v5'`` -> hopper), or None.

    Only ``Name-vN`` ids qualify: Brax's envs share the names but not the reward scale.
    """
    if not env_id or not re.fullmatch(r"[A-Za-z0-9]+-v\d+", env_id):
        return None
    return D4RL_REF_RETURNS.get(env_id.split("-")[0].lower())


def normalized_score(ret: float, refs: tuple[float, float] | None) -> float | None:
    """D4RL normalized score ``100 * (ret - min) / (max - min)``; None without references."""
    if refs is None:
        return None
    lo, hi = refs
    return 100.0 * (float(ret) - lo) / (hi - lo)


def eval_points(total: int, every: int) -> list[int]:
    """Steps at which to evaluate: every ``every`` steps, and at ``total``."""
    points = list(range(every, total, every))
    return [*points, total]


def _claim(out: str) -> Any:
    """Hold an exclusive ``flock`` on ``out/.lock`` while this process lives, or exit 2.

    The same lock file jaxrl's runs hold (``jaxrl.loops.config.claim_run_dir``), so the suite
    sees a peer run another process is training (``run_dir_in_use``) and leaves it alone: two
    processes in one directory would interleave their checkpoints and metrics rows.
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no guard
        return None
    handle = open(os.path.join(out, ".lock"), "a")  # noqa: SIM115 (held while the run lasts)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        print(f"error: {out} is being trained by another process (it holds {out}/.lock)",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None
    return handle


class RunDir:
    """One peer run's directory: config, metrics rows, checkpoints and summary.

    Args:
        out: the directory (created when missing).
    """

    def __init__(self, out: str) -> None:
        self.out = out
        self.ckpt_root = os.path.join(out, "checkpoints")
        self.metrics_path = os.path.join(out, "metrics.csv")
        self.summary_path = os.path.join(out, "summary.json")
        self.config_path = os.path.join(out, "config.json")
        os.makedirs(out, exist_ok=True)
        self._lock = _claim(out)
        self._segment_start = time.perf_counter()
        self._wall_before = 0.0

    def exit_if_finished(self) -> None:
        """Print the summary and exit 0 when the run already finished."""
        summary = read_json(self.summary_path)
        if summary is not None:
            print(json.dumps(summary), flush=True)
            raise SystemExit(0)

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` (agent, env, dataset, seed, impl, total_steps, settings).

        A directory that already holds a run of another agent, env, dataset, seed or budget
        is refused (exit 2): resuming continues the same run only.
        """
        old = read_json(self.config_path)
        keys = ("agent", "env", "dataset", "seed", "total_steps")
        if old is not None and any(old.get(k) != config.get(k) for k in keys):
            was = {k: old.get(k) for k in keys}
            now = {k: config.get(k) for k in keys}
            print(
                f"error: {self.out} holds another run ({was}, asked for {now}); "
                "choose another --out or delete it",
                file=sys.stderr,
            )
            raise SystemExit(2)
        write_json(self.config_path, config)

    # -- checkpoints -------------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any] | None:
        """The latest checkpoint ``{"step", "dir", "wall_clock_s", ...}``, or None.

        Side effects: the wall clock of the earlier segments is carried on, and metrics rows
        past the checkpoint's step are dropped. Without a checkpoint, metrics start empty.
        """
        meta = read_json(os.path.join(self.ckpt_root, "checkpoint.json"))
        if meta is not None:
            meta["dir"] = os.path.join(self.ckpt_root, meta["dir"])
            self._wall_before = float(meta["wall_clock_s"])
        self._truncate_metrics(meta["step"] if meta else 0)
        return meta

    def save_checkpoint(self, step: int, save: Callable[[str], None], **extra: Any) -> None:
        """Write a checkpoint at ``step``: ``save(folder)`` writes the library's files.

        Args:
            step: training step the checkpoint holds.
            save: writes the peer library's files into the given (new, empty) folder.
            **extra: more JSON fields for ``checkpoint.json``.
        """
        name = f"step_{step}"
        folder = os.path.join(self.ckpt_root, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        save(folder)
        meta = {"step": step, "dir": name, "wall_clock_s": self.wall_clock_s(), **extra}
        write_json(os.path.join(self.ckpt_root, "checkpoint.json"), meta)
        for old in os.listdir(self.ckpt_root):
            if old.startswith("step_") and old != name:
                shutil.rmtree(os.path.join(self.ckpt_root, old), ignore_errors=True)

    def wall_clock_s(self) -> float:
        """Seconds of wall clock over every segment of this run, the current one included."""
        return self._wall_before + time.perf_counter() - self._segment_start

    # -- metrics -----------------------------------------------------------------------------

    def _rows(self) -> list[dict[str, str]]:
        if not os.path.exists(self.metrics_path):
            return []
        with open(self.metrics_path, newline="") as f:
            rows = list(csv.DictReader(f))
        # A row cut short by a kill has empty fields; it is dropped.
        return [r for r in rows if all(r.get(k) not in (None, "") for k in METRICS_HEADER)]

    def _truncate_metrics(self, step: int) -> None:
        rows = [r for r in self._rows() if int(r["step"]) <= step]
        tmp = f"{self.metrics_path}.tmp{os.getpid()}"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, METRICS_HEADER, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, self.metrics_path)

    def append_metrics(self, step: int, mean: float, std: float) -> None:
        """Append one evaluation row to ``metrics.csv``."""
        with open(self.metrics_path, "a", newline="") as f:
            csv.writer(f).writerow([step, repr(float(mean)), repr(float(std))])
            f.flush()

    def last_eval(self) -> tuple[int, float, float] | None:
        """``(step, mean, std)`` of the last metrics row, or None."""
        rows = self._rows()
        if not rows:
            return None
        r = rows[-1]
        return int(r["step"]), float(r["eval_return"]), float(r["eval_return_std"])

    # -- the end -----------------------------------------------------------------------------

    def finish(
        self, config: dict[str, Any], refs: tuple[float, float] | None, **rates: Any
    ) -> dict[str, Any]:
        """Write and print ``summary.json`` from the last metrics row; return it.

        Args:
            config: the run's config (agent, env, seed, impl, total_steps are copied).
            refs: reference returns for the normalized score, or None.
            **rates: ``env_steps_per_s`` or ``updates_per_s`` (and any other extra fields).
        """
        last = self.last_eval()
        if last is None:
            raise RuntimeError(f"{self.metrics_path} has no evaluation row; nothing to summarize")
        step, mean, std = last
        summary = {
            "agent": config["agent"],
            "env": config["env"],
            "seed": config["seed"],
            "impl": config["impl"],
            "total_steps": step,
            "final_eval_return_mean": mean,
            "final_eval_return_std": std,
            "normalized_score": normalized_score(mean, refs),
            "wall_clock_s": self.wall_clock_s(),
            **rates,
        }
        write_json(self.summary_path, summary)
        print(json.dumps(summary), flush=True)
        return summary
