"""``jaxrl finetune DIR --online-steps M``: continue an offline run directory online."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import tyro

from jaxrl.cli.common import guard, parse, print_summary


@dataclasses.dataclass(frozen=True)
class FinetuneArgs:
    """The options of ``jaxrl finetune``."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the offline run directory to continue"""
    online_steps: int
    """env steps online"""
    offline_ratio: float | None = None
    """dataset share of each minibatch"""
    online_lr_schedule: Literal["constant", "cosine"] | None = None
    """online learning rates: constant (default) or a new cosine decay"""


def run(argv: list[str]) -> None:
    """Parse ``argv``, fine-tune and print the summary line."""
    from jaxrl.run.finetune import finetune_run

    a = parse(FinetuneArgs, argv, "jaxrl finetune", "Continue an offline run directory online.")
    summary = guard(
        lambda: finetune_run(a.run_dir, a.online_steps, a.offline_ratio, a.online_lr_schedule)
    )
    print_summary(summary)
