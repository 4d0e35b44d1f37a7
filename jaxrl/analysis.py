"""Plots and score tables of many runs: seeds, sweeps, agent comparisons (``jaxrl plot``).

Runs are read through the run-directory contract (DESIGN.md): a directory is a run when it holds
``metrics.csv``; its ``config.json`` says which configuration it trained. Runs whose configs agree
on everything except the seed and per-run bookkeeping (output directory, progress bar, TensorBoard,
wandb) are seeds of one configuration and form a group. For each group we report the interquartile
mean (IQM) of the final evaluation returns with a percentile-bootstrap confidence interval over
runs, as recommended by Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS 2021, the ``rliable`` library). With one task per group, rliable's stratified
bootstrap reduces to resampling the group's runs with replacement, which is what we do here, in
numpy (rliable itself pulls in heavy dependencies). The statistics are in
``jaxrl.analysis_stats``; ``iqm`` and ``bootstrap_ci`` are re-exported here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl.analysis_stats import bootstrap_ci, iqm
from jaxrl.logging import read_metrics, write_json

# Config entries that differ between seeds of one configuration without changing what it trains:
# they must not split a group. Keys are dotted paths into config.json.
PER_RUN_KEYS = frozenset(
    {
        "seed",
        "versions",
        "train.seed",
        "train.out",
        "train.num_seeds",
        "train.progress",
        "train.tensorboard",
        "train.wandb_project",
    }
)

_FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory's evaluations.

    Attributes:
        path: the run directory.
        config: its ``config.json`` (empty when it has none).
        steps: the steps of its evaluation rows, ascending.
        returns: ``eval_return`` at those steps.
    """

    path: str
    config: dict[str, Any]
    steps: np.ndarray
    returns: np.ndarray

    @property
    def final_return(self) -> float:
        """Return of the last evaluation (a completed run's ``final_eval_return_mean``)."""
        return float(self.returns[-1])

    @property
    def final_step(self) -> int:
        """Step of the last evaluation."""
        return int(self.steps[-1])


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs of one configuration (they differ only in seed and bookkeeping).

    Attributes:
        label: the fields that tell this group from the others, e.g. ``actor_lr=0.0001 tau=0.005``.
        fields: those fields as a dict (short name -> value).
        runs: the group's runs.
    """

    label: str
    fields: dict[str, Any]
    runs: tuple[Run, ...]


def find_runs(paths: Sequence[str]) -> list[str]:
    """Expand each path into the run directories it holds.

    A path with ``metrics.csv`` is a run; otherwise every directory below it with ``metrics.csv``
    is (the members of a multi-seed or sweep directory, whose root holds only aggregates). The
    search does not descend into a run. Each run is listed once, in the order given, then sorted
    within each path.

    Args:
        paths: run directories or directories containing them.

    Returns:
        The run directories.

    Raises:
        ValueError: if a path is not a directory or no run is found under it.
    """
    runs: list[str] = []
    seen: set[str] = set()
    for path in paths:
        if not os.path.isdir(path):
            raise ValueError(
                f"{path!r} is not a directory; pass run directories (from `jaxrl train --out`) or "
                "directories that contain them."
            )
        found = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            if "metrics.csv" in files:
                found.append(root)
                dirs.clear()  # a run's subdirectories (checkpoints, ...) are its own
        if not found:
            raise ValueError(
                f"No runs under {path!r}: a run directory holds metrics.csv (written by `jaxrl "
                "train`). Pass run directories or a multi-seed / sweep directory holding them."
            )
        for run in found:
            key = os.path.realpath(run)
            if key not in seen:
                seen.add(key)
                runs.append(run)
    return runs


def load_run(path: str) -> Run | None:
    """Read a run directory's evaluations and config; ``None`` if it has not evaluated yet.

    Raises:
        ValueError: if ``metrics.csv`` or ``config.json`` cannot be parsed.
    """
    metrics = os.path.join(path, "metrics.csv")
    try:
        rows = [r for r in read_metrics(metrics) if "eval_return" in r and "step" in r]
    except ValueError as err:
        raise ValueError(
            f"{metrics} is not a jaxrl metrics file ({err}); every cell must be a number or empty."
        ) from None
    if not rows:
        return None
    rows.sort(key=lambda r: r["step"])
    config_path = os.path.join(path, "config.json")
    config: dict[str, Any] = {}
    if os.path.exists(config_path):
        try:
            with open(config_path) as f:
                config = json.load(f)
        except ValueError as err:
            raise ValueError(
                f"{config_path} is not valid JSON ({err}); fix or delete it (without it the run "
                "is plotted on its own)."
            ) from None
    return Run(
        path=path,
        config=config,
        steps=np.array([r["step"] for r in rows], dtype=np.int64),
        returns=np.array([r["eval_return"] for r in rows], dtype=np.float64),
    )


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if name in PER_RUN_KEYS:
            continue
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            # Lists are not hashable; JSON text is, and compares as the values do.
            flat[name] = json.dumps(value, sort_keys=True) if isinstance(value, list) else value
    return flat


def config_key(run: Run) -> tuple[tuple[str, Any], ...]:
    """What identifies a run's configuration: its flattened config without per-run keys.

    A run without ``config.json`` cannot be matched with others, so its directory is its key.
    """
    if not run.config:
        return (("run", run.path),)
    return tuple(sorted(_flatten(run.config).items()))


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group runs by configuration and label each group by what tells it from the others.

    A label lists ``name=value`` for each config field whose value is not the same in every group
    that has it (fields of one agent's config are absent from another agent's and do not count;
    the agent name tells them apart). With one group, the label is ``AGENT on ENV``.

    Args:
        runs: the runs, each with its config.

    Returns:
        The groups, in the order of their first run.
    """
    keyed: dict[tuple, list[Run]] = {}
    for run in runs:
        keyed.setdefault(config_key(run), []).append(run)
    flats = [dict(k) for k in keyed]
    members = list(keyed.values())
    if len(flats) == 1:
        return [Group(_title(members[0][0].config) or members[0][0].path, {}, tuple(members[0]))]
    names = sorted({k for f in flats for k in f}, key=_field_order)
    differing = [
        k for k in names if len({json.dumps(f[k], sort_keys=True) for f in flats if k in f}) > 1
    ]
    short = _short_names(differing)
    groups = []
    for flat, rs in zip(flats, members, strict=True):
        fields = {short[k]: flat[k] for k in differing if k in flat}
        if "run" in flat and len(flat) == 1:  # no config.json: its directory says what it is
            label = flat["run"]
        else:
            label = " ".join(f"{name}={_fmt_value(v)}" for name, v in fields.items())
            label = label or _title(rs[0].config) or rs[0].path
        groups.append(Group(label, fields, tuple(rs)))
    return _dedupe_labels(groups)


def _field_order(key: str) -> tuple[int, str]:
    first = {"agent": 0, "env": 1, "dataset": 2}
    return (first.get(key, 3), key)


def _short_names(keys: list[str]) -> dict[str, str]:
    """``train.total_steps`` -> ``total_steps``, unless two keys would get the same short name."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last, strict=True)}


def _fmt_value(v: Any) -> str:
    if isinstance(v, str) and v.startswith("["):
        try:
            return ",".join(str(x) for x in json.loads(v))
        except ValueError:
            return v
    return str(v)


def _dedupe_labels(groups: list[Group]) -> list[Group]:
    # Groups whose only differences are fields some of them lack (e.g. configs written by two
    # jaxrl versions) would share a label; number them rather than merge them.
    labels = [g.label for g in groups]
    out = []
    for i, g in enumerate(groups):
        if labels.count(g.label) > 1:
            g = dataclasses.replace(g, label=f"{g.label} #{labels[: i + 1].count(g.label)}")
        out.append(g)
    return out


def _title(config: dict[str, Any]) -> str:
    agent, env = config.get("agent"), config.get("env") or config.get("dataset")
    return f"{agent} on {env}" if agent and env else (agent or env or "")


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


def final_scores(group: Group, *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """A group's final-score statistics over its runs.

    A run's final score is its last evaluation (for a completed run, the ``final_eval_return_mean``
    of its ``summary.json``; for a run still training, its latest evaluation, whose step the
    ``last_step`` entries show).

    Returns:
        ``label``, ``fields``, ``runs`` (directories), ``n_runs``, ``final_returns``,
        ``last_step_min``, ``last_step_max``, ``mean``, ``iqm``, ``iqm_low``, ``iqm_high``
        (95% percentile-bootstrap CI over runs) and ``median``.
    """
    finals = np.array([r.final_return for r in group.runs])
    point, low, high = bootstrap_ci(finals, iqm, n_boot=n_boot, seed=seed)
    last = [r.final_step for r in group.runs]
    return {
        "label": group.label,
        "fields": group.fields,
        "runs": [r.path for r in group.runs],
        "n_runs": len(group.runs),
        "final_returns": finals.tolist(),
        "last_step_min": min(last),
        "last_step_max": max(last),
        "mean": float(finals.mean()),
        "iqm": point,
        "iqm_low": low,
        "iqm_high": high,
        "median": float(np.median(finals)),
    }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The final-score table (rows from ``final_scores``) as markdown."""
    lines = [
        "| group | runs | last eval step | mean | IQM [95% CI] | median |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lo, hi = r["last_step_min"], r["last_step_max"]
        steps = f"{lo}" if lo == hi else f"{lo}-{hi}"
        iqm_ci = f"{r['iqm']:.2f} [{r['iqm_low']:.2f}, {r['iqm_high']:.2f}]"
        lines.append(
            f"| {r['label']} | {r['n_runs']} | {steps} | {r['mean']:.2f} | {iqm_ci} | "
            f"{r['median']:.2f} |"
        )
    return "\n".join(lines) + "\n"


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


def plot_command(argv: Sequence[str]) -> dict[str, str]:
    """``jaxrl plot DIR [DIR ...] [--out PREFIX|FILE.png] [--boot N] [--seed S]``.

    Finds the runs under the directories, groups them by configuration, draws the groups'
    learning curves (mean and 95% bootstrap CI over runs) and writes the final-score table (runs,
    mean, IQM with its 95% CI, median; best IQM first) as markdown and JSON. Prints the table and
    the paths written.

    Returns:
        The paths written: ``{"png": ..., "md": ..., "json": ...}``.

    Raises:
        ValueError: when no run with an evaluation is found, or an option is out of range.
    """
    p = argparse.ArgumentParser(
        prog="jaxrl plot",
        description="Learning curves and a final-score table (IQM, bootstrap CIs) of runs, seeds "
        "and sweeps; runs with the same config except the seed form one group.",
    )
    p.add_argument("dirs", nargs="+", help="run directories or directories containing runs")
    p.add_argument(
        "--out",
        default="learning_curves",
        help="output prefix (writes PREFIX.png, .md, .json), FILE.png (tables next to it) or DIR/",
    )
    p.add_argument("--boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    a = p.parse_args(list(argv))
    if a.boot < 1:
        raise ValueError(f"--boot must be at least 1, got {a.boot}.")

    runs, pending = [], []
    for path in find_runs(a.dirs):
        run = load_run(path)
        if run is None:
            pending.append(path)
        else:
            runs.append(run)
    if not runs:
        raise ValueError(
            f"None of the {len(pending)} runs found has an evaluation yet (no eval_return in "
            "metrics.csv); plot again after their first evaluation (--eval-every)."
        )
    groups = group_runs(runs)
    rows = [final_scores(g, n_boot=a.boot, seed=a.seed) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: -rows[i]["iqm"])
    groups, rows = [groups[i] for i in order], [rows[i] for i in order]
    curves = [learning_curve(g, n_boot=a.boot, seed=a.seed) for g in groups]

    png, md, js = output_paths(a.out)
    for path in (png, md, js):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    title = _title(runs[0].config) if len(groups) > 1 and _same_task(runs) else ""
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
    write_json(js, {"n_boot": a.boot, "seed": a.seed, "confidence": 0.95, "groups": rows})

    print(table, end="")
    for path in pending:
        print(f"skipped {path}: no evaluation yet")
    for group, curve in zip(groups, curves, strict=True):
        if curve is None:
            print(f"no curve for {group.label}: its runs have no evaluation step in common")
    print(f"wrote {png}, {md}, {js}")
    return {"png": png, "md": md, "json": js}


def _same_task(runs: Sequence[Run]) -> bool:
    return len({_title(r.config) for r in runs}) == 1


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
    "plot_command",
    "plot_groups",
]
