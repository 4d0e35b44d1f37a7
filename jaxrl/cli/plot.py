"""``jaxrl plot DIR [DIR ...] [--out PREFIX|FILE.png] [--boot N] [--seed S]``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Annotated

import tyro

from jaxrl.cli.common import guard


@dataclasses.dataclass(frozen=True)
class PlotArgs:
    """The options of ``jaxrl plot``."""

    dirs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """run directories or directories containing runs"""
    out: str = "learning_curves"
    """output prefix (writes PREFIX.png, .md, .json), FILE.png (tables next to it) or DIR/"""
    boot: int = 2000
    """bootstrap resamples"""
    seed: int = 0
    """seed of the bootstrap"""


def plot_command(argv: Sequence[str]) -> dict[str, str]:
    """Parse ``jaxrl plot`` options and plot (``jaxrl.analysis.curves.plot_runs``).

    Returns:
        The paths written: ``{"png": ..., "md": ..., "json": ...}``.

    Raises:
        ConfigError: when no run with an evaluation is found, or an option is out of range.
    """
    from jaxrl.analysis.curves import plot_runs

    description = (
        "Learning curves and a final-score table (IQM, bootstrap CIs) of runs, seeds and "
        "sweeps; runs with the same config except the seed form one group."
    )
    a = tyro.cli(PlotArgs, args=list(argv), prog="jaxrl plot", description=description)
    if not a.dirs:  # a usage error, as tyro reports one: exit 2
        print("jaxrl plot: give at least one run directory (see --help).", file=sys.stderr)
        raise SystemExit(2)
    return plot_runs(a.dirs, a.out, a.boot, a.seed)


def run(argv: list[str]) -> None:
    """``jaxrl plot``: a user error exits 2 with one line."""
    guard(lambda: plot_command(argv))
