"""Everything a training loop does that is not "one step", shared by the three loops.

A loop (``host``, ``fused``, ``offline``) builds its device state, then hands the rest to a
``Harness``: the run directories (``config.json`` is written first, by
``jaxrl.loops.config.prepare_run_dir``), resuming from the newest checkpoint of the loop's
phase, the metrics logger, the checkpointer, the progress bar, the SIGINT/SIGTERM stop flag,
one ``Cadence`` that says when to log, evaluate and checkpoint, and ``summary.json``.

Members (vmapped seeds, and sweeps of seeds x settings) share one harness: it serves a list
of run directories over a state with a leading member axis (``stacked=True``), and every member
resumes, logs, evaluates and summarizes on its own. Every loop state carries ``nonfinite``, a
device-side count of the updates after which the agent held a NaN; it is read with the metrics
at log points (column ``train/nonfinite_updates``), so divergence costs no host work per step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.data.scores import normalized_score, reference_returns
from jaxrl.errors import ConfigError
from jaxrl.loops.cadence import Cadence, Points, StopFlag, eval_hooks
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.config import TrainConfig, commit_run_config, release_run_dirs
from jaxrl.loops.device import NONFINITE
from jaxrl.loops.logging import RunLogger, write_json
from jaxrl.loops.mesh import host_array, member, primary


class Harness:
    """The run directories of one loop: resume, log, evaluate, checkpoint, progress, summary.

    Args:
        name: the agent's name (``summary.json``, plot titles).
        cfg: loop options; ``total_steps`` counts this loop's steps.
        outs: one run directory per member (``config.json`` already written).
        phase: recorded in every checkpoint; a loop resumes only checkpoints of its phase
            (``"offline"``, or ``"online"`` for the env loops).
        stacked: the loop state has a leading member axis (else ``outs`` has one directory).
        step_offset: steps of an earlier phase in the same directory: rows and checkpoints are
            numbered ``step_offset + step``.
        where: what the plot titles say the agent trained on (default ``cfg.env``).
        score_fn: ``return -> normalized score or None`` (default: D4RL's, for ``cfg.env``).
        seeds: each member's seed (default ``cfg.seed + i``; a sweep's members repeat seeds).
    """

    def __init__(
        self,
        name: str,
        cfg: TrainConfig,
        outs: list[str],
        *,
        phase: str = "online",
        stacked: bool = False,
        step_offset: int = 0,
        where: str | None = None,
        score_fn: Any = None,
        seeds: list[int] | None = None,
    ):
        self.name, self.cfg, self.outs, self.phase = name, cfg, list(outs), phase
        self.stacked, self.step_offset = stacked, step_offset
        self.where = where or cfg.env
        self.score_fn = score_fn or partial(normalized_score, ref=reference_returns(cfg.env))
        self.cadence = Cadence.of(cfg)
        self.primary = primary()  # process 0 writes; every process takes part in checkpoints
        tb, wandb, w = cfg.tensorboard, cfg.wandb_project, self.primary
        self.loggers = [RunLogger(o, tb, wandb, os.path.basename(o), writes=w) for o in outs]
        self.ckpts = [
            Checkpointer(os.path.join(o, "checkpoints"), max_to_keep=cfg.max_to_keep) for o in outs
        ]
        # Wall clock of the segments before this one (a resumed run's summary counts them all).
        self.step, self.updates, self.wall_before = 0, 0, 0.0
        self._start = (0, time.perf_counter())
        self.last_eval = np.full((len(outs), 2), np.nan)
        self.stop, self.bar, self._warned = StopFlag(), None, False
        self._pending_eval, self.last_nonfinite = False, [0] * len(outs)
        # The NaN guard: per member, the last logged step with a clean agent, and the step at
        # which the guard stopped it ('stop' mode), or None.
        self.clean_step = [0] * len(outs)
        self.diverged: list[int | None] = [None] * len(outs)
        self.seeds = list(seeds) if seeds is not None else [cfg.seed + i for i in range(len(outs))]

    # -- resume -------------------------------------------------------------------------------

    def resume(self, state: Any, legacy_phase: str | None = None) -> tuple[Any, list[dict]]:
        """Restore every member's newest checkpoint of this phase, or keep the fresh ``state``.

        ``state`` is the fresh loop state (with the member axis when ``stacked``); it is also
        the template checkpoints are restored into. Returns ``(state, metas)``, ``metas`` empty
        when there was nothing of this phase to resume. Checkpoints without a recorded phase
        (older runs) count as ``legacy_phase`` (default: this loop's phase). The settings
        ``prepare_run_dir`` left pending become ``config.json`` only once this succeeded, so a
        resume that fails leaves the run directory as it was.
        """
        try:
            state, metas = self._restore(state, legacy_phase)
        except BaseException:
            for out in self.outs:
                commit_run_config(out, keep=False)
            raise
        for out in self.outs:
            commit_run_config(out)
        self.clean_step = [self.step] * len(self.outs)
        for logger in self.loggers:
            logger.truncate(self.step_offset + self.step)
        for i, logger in enumerate(self.loggers):
            evals = [r for r in logger.rows if "eval_return" in r]
            if metas and metas[i].get("last_eval") is not None:
                self.last_eval[i] = metas[i]["last_eval"]
            elif evals:
                last = evals[-1]
                self.last_eval[i] = (last["eval_return"], last.get("eval_return_std", np.nan))
        if metas:
            print(f"Resuming {', '.join(self.outs)} from step {self.step_offset + self.step}.")
        return state, metas

    def _restore(self, state: Any, legacy_phase: str | None) -> tuple[Any, list[dict]]:
        """The newest checkpoint of this phase (``resume`` without its bookkeeping)."""
        latest = [c.latest_step() for c in self.ckpts]
        metas: list[dict] = []
        if any(s is not None for s in latest):
            if len(set(latest)) != 1:
                raise ConfigError(
                    f"The seed run directories hold checkpoints of different steps ({latest}); "
                    "resume each seed on its own (jaxrl train ... --seed S --out DIR) or start "
                    "anew."
                )
            phase = self.ckpts[0].meta(latest[0]).get("phase") or legacy_phase or self.phase
            if phase != self.phase and not self.step_offset and self.phase == "online":
                # Not an offline-to-online run's online phase: a foreign checkpoint, which
                # training over it would evict.
                raise ConfigError(
                    f"{self.outs[0]}/checkpoints holds checkpoints of an {phase} phase (step "
                    f"{latest[0]}), not of this online run. Use a new --out directory, or "
                    f"`jaxrl finetune {self.outs[0]} --online-steps N` to continue an offline "
                    "run online."
                )
            if phase == self.phase:
                template = jax.tree.map(lambda x: x[0], state) if self.stacked else state
                restored, metas = zip(*(c.restore(template) for c in self.ckpts), strict=True)
                state, metas = restored[0], list(metas)
                if self.stacked:
                    state = jax.tree.map(lambda *xs: jnp.stack(xs), *restored)
                self.step = int(metas[0]["step"])
                self.wall_before = metas[0].get("wall_clock_s")  # None: a checkpoint from before
        return state, metas

    def completed(self) -> list[dict[str, Any]] | None:
        """The existing summaries when every member already finished; the loggers are closed."""
        if self.step < self.cadence.total_steps:
            return None
        summaries = []
        for out in self.outs:
            path = os.path.join(out, "summary.json")
            if not os.path.exists(path):
                return None
            with open(path) as f:
                summary = json.load(f)
            if not (summary.get("completed") and summary.get("total_steps") == self.step):
                return None
            summaries.append(summary)
        print(f"{', '.join(self.outs)} already completed {self.step} steps; nothing to do.")
        self.close()
        release_run_dirs(self.outs)
        return summaries

    # -- the loop -----------------------------------------------------------------------------

    def __enter__(self) -> Harness:
        self.stop.__enter__()
        try:
            for logger in self.loggers:
                logger.open()
            if self.cfg.progress and self.primary:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=self.cfg.total_steps, initial=self.step, unit="step", dynamic_ncols=True
                )
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        self._start = (self.step, time.perf_counter())
        self._last_log = self._start
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop.__exit__(*exc)
        finally:
            self.close(failed=exc[0] is not None)

    def close(self, failed: bool = False) -> None:
        """Close the progress bar and the loggers (TensorBoard writer, wandb run); idempotent.

        ``finish`` and leaving the ``with`` block both call it, on any exit (a stop, an
        exception such as Optuna's ``TrialPruned``). Before the ``with`` block nothing is
        open: the loggers start wandb on entering it and TensorBoard at their first row, so a
        loop whose setup fails leaks nothing. ``failed``: the run ended by an exception (the
        wandb run is marked failed, and no ``finish`` follows: the run directories are freed).
        """
        bar, self.bar = self.bar, None
        try:
            if bar is not None:
                bar.close()
        finally:
            for logger in self.loggers:
                logger.close(failed)
            if failed:
                release_run_dirs(self.outs)

    def running(self) -> bool:
        """True until the budget is done or a stop signal arrived.

        The loops ask at the end of every point, after its log and checkpoint: an evaluation
        recorded there is handed to the ``on_eval`` hooks first.
        """
        if self._pending_eval:
            self._pending_eval = False
            count = self.last_nonfinite
            for hook in eval_hooks():
                for i, out in enumerate(self.outs):
                    step = self.step_offset + self.step
                    hook(out, step, float(self.last_eval[i, 0]), int(count[i]))
        if all(d is not None for d in self.diverged):
            return False
        return self.step < self.cadence.total_steps and not self.stop.raised

    def advance(self, steps: int, updates: int = 0) -> Points:
        """Count ``steps`` loop steps and ``updates`` gradient steps; the points now due."""
        prev = self.step
        self.step += steps
        self.updates += updates
        if self.bar is not None:
            self.bar.update(steps)
        return self.cadence.at(prev, self.step)

    def end_budget_here(self) -> None:
        """End the budget here (the plan loop's: episodes that terminate early end it early)."""
        self.cadence = dataclasses.replace(self.cadence, total_steps=self.step)

    def rate(self) -> float:
        """Steps per second since the last log point."""
        return (self.step - self._last_log[0]) / max(time.perf_counter() - self._last_log[1], 1e-9)

    def record_eval(self, returns: Any, *rows: dict[str, float]) -> None:
        """Keep each member's evaluation (``returns``: ``[members, episodes]``) in its row."""
        returns = np.asarray(returns).reshape(len(self.outs), -1)
        self.last_eval = np.stack([returns.mean(1), returns.std(1)], 1)
        self.last_nonfinite = [row.get(NONFINITE, 0) for row in rows]
        self._pending_eval = True
        for row, (mean, std) in zip(rows, self.last_eval, strict=True):
            row["eval_return"], row["eval_return_std"] = float(mean), float(std)
            score = self.score_fn(float(mean))
            if score is not None:
                row["eval_normalized_score"] = score

    def log(self, *rows: dict[str, float]) -> None:
        """Write one metrics row per member at the current step; the NaN guard reads it.

        A row whose ``train/nonfinite_updates`` grew is written with its non-finite values
        (other rows drop them: agents report NaN for sub-steps they skip). Then, by
        ``cfg.on_nonfinite``: 'stop' ends that member (``diverge``), 'skip' and 'warn' say so once.
        """
        for i, (logger, row) in enumerate(zip(self.loggers, rows, strict=True)):
            bad = row.get(NONFINITE, 0) > 0 and self.diverged[i] is None
            logger.log(self.step_offset + self.step, row, keep_nonfinite=bad)
            if not bad:
                self.clean_step[i] = self.step
            elif self.cfg.on_nonfinite == "stop":
                self.diverge(i, sorted(k for k, v in row.items() if not math.isfinite(v)))
            elif not self._warned:
                self._warn_nonfinite(logger.out_dir, row)
        self._last_log = (self.step, time.perf_counter())
        if self.bar is not None:
            rate = rows[0].get("time/env_steps_per_s", rows[0].get("time/updates_per_s", 0.0))
            label = "ups" if self.phase == "offline" else "sps"
            postfix = {label: f"{rate:.0f}", "eval": f"{np.mean(self.last_eval[:, 0]):.1f}"}
            self.bar.set_postfix(postfix, refresh=False)

    def diverge(self, i: int, names: list[str] | None = None) -> None:
        """Stop member ``i``: an update left NaN in its agent (the NaN guard's 'stop' mode).

        Its checkpoints stop here, so the newest one is the last good state; the run exits
        with status 3 (``jaxrl train``). ``names``: the non-finite metrics of its row.
        """
        if self.diverged[i] is not None:
            return
        self.diverged[i] = self.step
        first, now = self.step_offset + self.clean_step[i], self.step_offset + self.step
        latest = self.ckpts[i].latest_step()
        kept = f"step {latest}" if latest is not None else "none written yet"
        what = f"non-finite: {', '.join(names)}" if names else "found before a checkpoint"
        print(
            f"error: {self.outs[i]}: training diverged: an update between step {first} and step "
            f"{now} left NaN values in the agent ({what}). The last good checkpoint is kept "
            f"({kept}). Lower the learning rates or check the data (NaN/huge rewards), or "
            "resume with --on-nonfinite skip to discard such updates.",
            file=sys.stderr,
        )

    def _warn_nonfinite(self, out: str, row: dict[str, float]) -> None:
        self._warned = True
        names = sorted(k for k, v in row.items() if not math.isfinite(v))
        done = "were skipped" if self.cfg.on_nonfinite == "skip" else "left NaN in the agent"
        print(
            f"warning: {out}: {int(row[NONFINITE])} updates {done} by step "
            f"{self.step_offset + self.step} (non-finite metrics: {', '.join(names) or 'none'}); "
            "the run continues."
        )

    def save(self, state: Any, *metas: dict[str, Any]) -> None:
        """Checkpoint each member's slice of ``state`` with its metadata (``metas``, optional).

        ``state.nonfinite`` (every loop state has it) is checked first: in 'stop' mode a member
        whose agent went NaN is not saved, so its newest checkpoint stays the last good one.
        """
        counts = np.reshape(host_array(state.nonfinite), -1)
        for i, ckpt in enumerate(self.ckpts):
            if self.cfg.on_nonfinite == "stop" and (self.diverged[i] is not None or counts[i] > 0):
                self.diverge(i)  # never let a diverged state evict the last good checkpoint
                continue
            part = member(state, i) if self.stacked else state
            meta = {"step": self.step, "last_eval": self.last_eval[i].tolist(), "phase": self.phase}
            meta["wall_clock_s"] = self.wall_clock()
            meta |= metas[i] if metas else {}
            ckpt.save(self.step_offset + self.step, part, meta)

    def save_if_stopped(self, state: Any, *metas: dict[str, Any]) -> None:
        """After the loop: checkpoint ``state`` when a stop signal ended it (resume from there).

        A stop that lands right after a scheduled checkpoint finds this step saved already.
        """
        step = self.step_offset + self.step
        if self.stop.raised and any(c.latest_step() != step for c in self.ckpts):
            self.save(state, *metas)

    # -- the end ------------------------------------------------------------------------------

    def wall_clock(self) -> float | None:
        """Seconds of training over every segment of a resumed run (None: a segment is unknown)."""
        now = time.perf_counter() - self._start[1]
        return None if self.wall_before is None else self.wall_before + now

    def finish(self, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Close the bar and loggers, plot, write ``summary.json`` (rates: this segment's)."""
        total, wall = self.wall_clock(), time.perf_counter() - self._start[1]
        self.close()
        for i, logger in enumerate(self.loggers):
            seed = f" (seed {self.seeds[i]})" if self.stacked else ""
            logger.plot(f"{self.name} on {self.where}{seed}")
        done = self.step >= self.cadence.total_steps
        if not done and any(d is None for d in self.diverged):
            print(
                f"Stopped at step {self.step}; checkpoint saved. Rerun the same command to resume."
            )
        summaries = []
        for i, out in enumerate(self.outs):
            mean, std = (float(x) for x in self.last_eval[i])
            ok, status = done, "completed" if done else "stopped"
            if self.diverged[i] is not None:
                ok, status = False, "diverged"
            summary = {
                "agent": self.name,
                "env": self.cfg.env,
                "seed": self.seeds[i],
                "total_steps": self.step,
                "final_eval_return_mean": mean if ok else None,
                "final_eval_return_std": std if ok else None,
                "normalized_score": self.score_fn(mean) if ok else None,
                "wall_clock_s": total,
                "env_steps_per_s": (self.step - self._start[0]) / max(wall, 1e-9),
                "updates_per_s": self.updates / max(wall, 1e-9),
                "completed": ok,
                "status": status,
                "diverged_at": None
                if self.diverged[i] is None
                else self.step_offset + self.diverged[i],
            }
            summary |= extra or {}
            if self.primary:
                write_json(os.path.join(out, "summary.json"), summary)
            summaries.append(summary)
        release_run_dirs(self.outs)  # written: other processes may resume or extend the runs
        return summaries


__all__ = ["Harness"]
