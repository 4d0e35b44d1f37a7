"""When a loop hands control back to the host, and what may end the run there.

``Cadence`` says which points (a metrics row, an evaluation, a checkpoint) a step or a chunk
crosses, and how many iterations to run before the next one. At evaluation points the
``Harness`` (``jaxrl.loops.harness``) calls the ``on_eval`` hooks, which may end the run;
``StopFlag`` turns SIGINT/SIGTERM into a flag the loops check between steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from typing import Any, NamedTuple

from jaxrl.loops.config import TrainConfig


class Points(NamedTuple):
    """What is due after a step or a chunk: a metrics row, an evaluation, a checkpoint."""

    log: bool
    eval: bool
    save: bool


@dataclasses.dataclass(frozen=True)
class Cadence:
    """When every loop logs, evaluates and checkpoints, in the loop's steps.

    A point is due when a step or chunk crosses a multiple of its period, and all are due at
    the end of the run. Every evaluation is also a log point.
    """

    log_every: int
    eval_every: int
    checkpoint_every: int
    total_steps: int

    @classmethod
    def of(cls, cfg: TrainConfig) -> Cadence:
        """The cadence of ``cfg`` (checkpoints default to the evaluation period)."""
        ckpt = cfg.checkpoint_every or cfg.eval_every
        return cls(cfg.log_every, cfg.eval_every, ckpt, cfg.total_steps)

    def at(self, prev: int, step: int) -> Points:
        """The points crossed by going from step ``prev`` to ``step``."""
        end = step >= self.total_steps
        at_eval = end or step // self.eval_every > prev // self.eval_every
        at_log = at_eval or step // self.log_every > prev // self.log_every
        at_save = end or step // self.checkpoint_every > prev // self.checkpoint_every
        return Points(at_log, at_eval, at_save)

    def chunk(self, step: int, unit: int = 1) -> int:
        """Iterations of ``unit`` steps to run from ``step`` before the host acts again.

        As many whole iterations as fit in the shortest period (at least one, and no more than
        the budget needs), ending early at the next point when an iteration boundary falls on
        it. So one-step iterations stop exactly at every point, and a fused loop whose
        iterations do not divide the periods keeps one chunk length (one compilation).
        """
        periods = (self.log_every, self.eval_every, self.checkpoint_every)
        to_next = min(p - step % p for p in periods)
        n = max(1, min(periods) // unit)
        if to_next % unit == 0:
            n = min(n, to_next // unit)
        return min(n, -(-(self.total_steps - step) // unit))


_EVAL_HOOKS: list[Any] = []


@contextlib.contextmanager
def on_eval(hook: Any) -> Any:
    """Call ``hook(out, step, eval_return, nonfinite)`` at every evaluation of every member.

    For tuners (Optuna's pruner, Ray Tune's reports) that run ``jaxrl.run.train`` in-process:
    ``out`` is the member's run directory, ``step`` its step (env steps; offline: gradient
    steps), ``eval_return`` the mean evaluation return and ``nonfinite`` the count of updates
    after which the agent held a NaN. The hook runs after the point's checkpoint is written
    (checkpoints fall on evaluation points by default). An exception it raises (e.g. Optuna's
    ``TrialPruned``) ends the run there.
    """
    _EVAL_HOOKS.append(hook)
    try:
        yield hook
    finally:
        _EVAL_HOOKS.remove(hook)


def eval_hooks() -> tuple[Any, ...]:
    """The hooks registered with ``on_eval`` now, in registration order."""
    return tuple(_EVAL_HOOKS)


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps, so state is saved consistently."""

    def __init__(self) -> None:
        self.raised = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: keep default handling
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.raised:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.raised = True

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


__all__ = ["Cadence", "Points", "StopFlag", "eval_hooks", "on_eval"]
