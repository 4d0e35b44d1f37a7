"""Plots and score tables of many runs: seeds, sweeps, agent comparisons (``jaxrl plot``).

Runs are read through the run-directory contract and runs whose configs agree on
everything except the seed and per-run bookkeeping form a group; finding, reading and grouping
runs and the final-score table are in ``jaxrl.analysis.runs`` and re-exported here. For each group
we report the interquartile mean (IQM) of the final evaluation returns with a percentile-bootstrap
confidence interval over runs, as recommended by Agarwal et al., "Deep Reinforcement Learning at
the Edge of the Statistical Precipice" (NeurIPS 2021, the ``rliable`` library). With one task per
group, rliable's stratified bootstrap reduces to resampling the group's runs with replacement,
which is what we do here, in numpy (rliable itself pulls in heavy dependencies). The statistics
are in ``jaxrl.analysis.stats``; ``iqm`` and ``bootstrap_ci`` are re-exported here. This module
draws the learning curves (``plot_runs``; ``jaxrl.cli.plot`` parses ``jaxrl plot``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from jaxrl.analysis.runs import (
    PER_RUN_KEYS as PER_RUN_KEYS,  # a public name of this module before the split: kept here
)
from jaxrl.analysis.runs import (
    Group,
    Run,
    config_key,
    final_scores,
    find_runs,
    group_runs,
    load_run,
    markdown_table,
    run_title,
    same_task,
)
from jaxrl.analysis.stats import bootstrap_ci, iqm
from jaxrl.errors import ConfigError
from jaxrl.loops.logging import write_json

_FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


@dataclasses.dataclass(frozen=True)
class Curve:
    """A group's learning curve: mean eval return over runs with a bootstrap CI at each step."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def learning_curve(group: Group, *, n_boot: int = 2000, seed: int = 0) -> Curve | None:
    """Mean eval return over the group's runs at each step, with a 95% bootstrap CI band.

    Only the steps at which every run of the group evaluated are used (no interpolation), so a
    group with a run that is still training is drawn up to that run's last evaluation.

    Returns:
        The curve, or ``None`` if the runs have no evaluation step in common.
    """
    common = group.runs[0].steps
    for run in group.runs[1:]:
        common = np.intersect1d(common, run.steps)
    if common.size == 0:
        return None
    table = np.stack([r.returns[np.searchsorted(r.steps, common)] for r in group.runs])
    mean, low, high = bootstrap_ci(table, lambda v: v.mean(axis=0), n_boot=n_boot, seed=seed)
    return Curve(common, np.atleast_1d(mean), np.atleast_1d(low), np.atleast_1d(high))


def plot_groups(
    groups: Sequence[Group], curves: Sequence[Curve | None], out_png: str, title: str = ""
) -> str:
    """Draw every group's mean learning curve and CI band into one figure; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for group, curve in zip(groups, curves, strict=True):
        if curve is None:
            continue
        n = len(group.runs)
        (line,) = ax.plot(curve.steps, curve.mean, label=f"{group.label} ({n} runs)")
        ax.fill_between(curve.steps, curve.low, curve.high, color=line.get_color(), alpha=0.2)
    offline = any(r.config.get("dataset") for g in groups for r in g.runs)
    ax.set_xlabel("steps" if offline else "environment steps")
    ax.set_ylabel("eval return (mean, 95% bootstrap CI)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def output_paths(out: str) -> tuple[str, str, str]:
    """``(figure, markdown, json)`` paths for ``--out``.

    ``FILE.png`` (or ``.pdf`` / ``.svg``) names the figure and puts the tables next to it
    (``FILE.md``, ``FILE.json``); a directory (existing, or ending in ``/``) gets
    ``learning_curves.*`` inside it; anything else is a prefix.
    """
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        out = os.path.join(out, "learning_curves")
    stem, ext = os.path.splitext(out)
    if ext.lower() in _FIGURE_SUFFIXES:
        return out, f"{stem}.md", f"{stem}.json"
    return f"{out}.png", f"{out}.md", f"{out}.json"


def plot_runs(
    dirs: Sequence[str], out: str = "learning_curves", n_boot: int = 2000, seed: int = 0
) -> dict[str, str]:
    """Plot the runs under ``dirs``: what ``jaxrl plot DIR [DIR ...]`` does.

    Finds the runs under the directories, groups them by configuration, draws the groups'
    learning curves (mean and 95% bootstrap CI over runs) and writes the final-score table (runs,
    mean, IQM with its 95% CI, median; best IQM first) as markdown and JSON. Prints the table and
    the paths written.

    Args:
        dirs: run directories or directories containing runs.
        out: output prefix (writes PREFIX.png, .md, .json), FILE.png (tables next to it) or DIR/.
        n_boot: bootstrap resamples.
        seed: seed of the bootstrap.

    Returns:
        The paths written: ``{"png": ..., "md": ..., "json": ...}``.

    Raises:
        ConfigError: when no run with an evaluation is found, or an option is out of range.
    """
    if n_boot < 1:
        raise ConfigError(f"--boot must be at least 1, got {n_boot}.")

    runs, pending = [], []
    for path in find_runs(dirs):
        run = load_run(path)
        if run is None:
            pending.append(path)
        else:
            runs.append(run)
    if not runs:
        raise ConfigError(
            f"None of the {len(pending)} runs found has an evaluation yet (no eval_return in "
            "metrics.csv); plot again after their first evaluation (--eval-every)."
        )
    groups = group_runs(runs)
    rows = [final_scores(g, n_boot=n_boot, seed=seed) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: -rows[i]["iqm"])
    groups, rows = [groups[i] for i in order], [rows[i] for i in order]
    curves = [learning_curve(g, n_boot=n_boot, seed=seed) for g in groups]

    png, md, js = output_paths(out)
    for path in (png, md, js):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    title = run_title(runs[0].config) if len(groups) > 1 and same_task(runs) else ""
    plot_groups(groups, curves, png, title)
    table = markdown_table(rows)
    with open(md, "w") as f:
        f.write(table)
    for row, curve in zip(rows, curves, strict=True):
        if curve is not None:
            row["curve"] = {
                "steps": curve.steps.tolist(),
                "mean": curve.mean.tolist(),
                "low": curve.low.tolist(),
                "high": curve.high.tolist(),
            }
    write_json(js, {"n_boot": n_boot, "seed": seed, "confidence": 0.95, "groups": rows})

    print(table, end="")
    for path in pending:
        print(f"skipped {path}: no evaluation yet")
    for group, curve in zip(groups, curves, strict=True):
        if curve is None:
            print(f"no curve for {group.label}: its runs have no evaluation step in common")
    print(f"wrote {png}, {md}, {js}")
    return {"png": png, "md": md, "json": js}


__all__ = [
    "Curve",
    "Group",
    "Run",
    "bootstrap_ci",
    "config_key",
    "final_scores",
    "find_runs",
    "group_runs",
    "iqm",
    "learning_curve",
    "load_run",
    "markdown_table",
    "output_paths",
    "plot_groups",
    "plot_runs",
]
