"""``jaxrl eval DIR [--episodes N] [--env ENV]``: print one JSON line with the evaluation return."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import tyro

from jaxrl.cli.common import guard, parse


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    """The options of ``jaxrl eval``."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory whose newest checkpoint is evaluated"""
    episodes: int | None = None
    """evaluation episodes (default: the run's --eval-episodes)"""
    env: str | None = None
    """evaluate on this env instead (same spaces): e.g. the real system's model of a sim-to-real
    run, or a perturbed simulator such as jax:pendulum?m=1.3"""


def run(argv: list[str]) -> None:
    """Parse ``argv``, evaluate the run and print the result as one JSON line."""
    from jaxrl.run.commands import evaluate_run

    description = "Evaluate the deterministic policy of a run directory's newest checkpoint."
    a = parse(EvalArgs, argv, "jaxrl eval", description)
    print(json.dumps(guard(lambda: evaluate_run(a.run_dir, a.episodes, a.env))))
