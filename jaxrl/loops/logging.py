"""Run-directory logging: metrics.csv, TensorBoard, optional wandb, learning-curve plot, summary.

The run-directory layout is a contract that scripts, sweeps and plots rely on: ``config.json``,
``metrics.csv`` (columns ``step`` and ``eval_return`` at eval points), ``summary.json``,
``checkpoints/``, TensorBoard event files and ``learning_curve.png``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any

import numpy as np


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and an atomic rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def read_metrics(path: str) -> list[dict[str, float]]:
    """Rows of a metrics.csv as dicts of floats (empty cells are dropped)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


class RunLogger:
    """Writes one run directory's metrics to CSV, TensorBoard and (opt-in) wandb.

    Args:
        out_dir: the run directory.
        tensorboard: write TensorBoard event files.
        wandb_project: if set, also log to this wandb project (requires ``pip install wandb``).
        run_name: name shown in wandb.
        config: the run's config, sent to wandb.
        writes: False for a logger that only keeps the rows (the processes other than 0 of a
            run over several processes: one process writes the run directory).
    """

    def __init__(
        self,
        out_dir: str,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        writes: bool = True,
    ):
        self.writes = writes
        if writes:
            os.makedirs(out_dir, exist_ok=True)
        self.out_dir = out_dir
        self.csv_path = os.path.join(out_dir, "metrics.csv")
        self.rows: list[dict[str, float]] = read_metrics(self.csv_path)
        self._tensorboard = tensorboard and writes
        self._tb = None
        self._purge_step: int | None = None
        self._wandb = None
        self._wandb_args = None
        if wandb_project and writes:
            from jaxrl.errors import require

            require("wandb", "wandb")  # fail at setup, naming the extra, not at the first log
            self._wandb_args = {
                "project": wandb_project,
                "name": run_name,
                "config": config,
                "dir": out_dir,
                "id": run_name,
                "resume": "allow",
            }

    def open(self) -> None:
        """Start the wandb run, if one was asked for (``log`` starts it otherwise).

        Nothing else is opened before the first ``log``: a logger that never logs holds no
        thread (TensorBoard's writer) and no wandb run, so a run that fails while it is set up
        leaks neither.
        """
        if self._wandb_args is not None and self._wandb is None:
            import wandb

            self._wandb = wandb.init(**self._wandb_args)

    def truncate(self, step: int) -> None:
        """Drop rows logged after ``step`` (used when resuming from an earlier checkpoint).

        TensorBoard events after ``step`` are purged by the writer the next ``log`` opens.
        """
        self.rows = [r for r in self.rows if r["step"] <= step]
        self._write_csv()
        self._purge_step = step + 1

    def log(self, step: int, metrics: dict[str, float], keep_nonfinite: bool = False) -> None:
        """Record ``metrics`` at ``step`` (merged into the row of the same step if present).

        Non-finite values are dropped unless ``keep_nonfinite`` (a diverged update: the NaN
        guard shows them in metrics.csv, as ``nan`` / ``inf``); TensorBoard and wandb get the
        finite values only.
        """
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        clean = {k: v for k, v in values.items() if math.isfinite(v)}
        kept = values if keep_nonfinite else clean
        if self.rows and self.rows[-1]["step"] == step:
            self.rows[-1].update(kept)
        else:
            self.rows.append({"step": float(step), **kept})
        self._write_csv()
        if self._tensorboard:
            tb = self._writer()
            for k, v in clean.items():
                tb.add_scalar(k, v, step)
            tb.flush()
        self.open()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def _writer(self) -> Any:
        """The TensorBoard writer, opened at the first use (after a resume: purging later steps)."""
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(self.out_dir, purge_step=self._purge_step)
            self._purge_step = None
        return self._tb

    def video(self, step: int, path: str, frames: Any, fps: float, tag: str = "eval/video") -> None:
        """Send a rollout video (``path``, its ``frames``) to TensorBoard and wandb at ``step``.

        TensorBoard gets a video summary: an animated GIF in an image summary, what
        ``SummaryWriter.add_video`` writes (without its moviepy dependency). wandb gets the mp4.
        """
        if not self.writes:
            return
        if self._tensorboard:
            from jaxrl.loops.video import tensorboard_video

            tb = self._writer()
            tb._get_file_writer().add_summary(tensorboard_video(tag, frames, fps), step)
            tb.flush()
        self.open()
        if self._wandb is not None:
            import wandb

            self._wandb.log({tag: wandb.Video(path, format="mp4")}, step=step)

    def _write_csv(self) -> None:
        if not self.writes:
            return
        keys = ["step"]
        if any("eval_return" in r for r in self.rows):
            keys.append("eval_return")
        for row in self.rows:
            keys += [k for k in row if k not in keys]
        lines = [",".join(keys)]
        for row in self.rows:
            cells = [_fmt(row[k]) if k in row else "" for k in keys]
            lines.append(",".join(cells))
        atomic_write_text(self.csv_path, "\n".join(lines) + "\n")

    def plot(self, title: str = "") -> str:
        """Write ``learning_curve.png`` (eval return against env steps); returns its path."""
        if not self.writes:
            return os.path.join(self.out_dir, "learning_curve.png")
        return plot_learning_curves(
            {title or "eval": self.csv_path},
            os.path.join(self.out_dir, "learning_curve.png"),
            title,
        )

    def close(self, failed: bool = False) -> None:
        """Flush and close the writers (the TensorBoard writer's thread ends); idempotent.

        Args:
            failed: the run ended by an exception: the wandb run is finished with exit code 1.
        """
        tb, self._tb = self._tb, None
        run, self._wandb, self._wandb_args = self._wandb, None, None
        try:
            if tb is not None:
                tb.close()
        finally:
            if run is not None and failed:
                run.finish(exit_code=1)
            elif run is not None:
                run.finish()


def _fmt(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def plot_learning_curves(curves: dict[str, str], out_png: str, title: str = "") -> str:
    """Plot eval return against steps for each ``label -> metrics.csv`` into ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, path in curves.items():
        rows = [r for r in read_metrics(path) if "eval_return" in r]
        if not rows:
            continue
        steps = np.array([r["step"] for r in rows])
        mean = np.array([r["eval_return"] for r in rows])
        ax.plot(steps, mean, marker="o", label=label)
        if all("eval_return_std" in r for r in rows):
            std = np.array([r["eval_return_std"] for r in rows])
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("eval return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
