"""Runs of ``jaxrl plot``: finding and reading run directories, grouping them, the score table.

Runs are read through the run-directory contract: a directory is a run when it holds
``metrics.csv``; its ``config.json`` says which configuration it trained. Runs whose configs agree
on everything except the seed and per-run bookkeeping (output directory, progress bar, TensorBoard,
wandb) are seeds of one configuration and form a group. A group's final scores are summarized by
the interquartile mean (IQM) with a percentile-bootstrap confidence interval over runs
(``jaxrl.analysis.stats``). The figures and the command are in ``jaxrl.analysis.curves``, which
re-exports these names.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl.analysis.stats import bootstrap_ci, iqm
from jaxrl.errors import ConfigError
from jaxrl.loops.logging import read_metrics

# Config entries that differ between seeds of one configuration without changing what it trains:
# they must not split a group. Keys are dotted paths into config.json; a nested key named ``seed``
# (a seed recorded again inside a settings block, as the peer libraries' runs do) is one too.
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
            raise ConfigError(
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
            raise ConfigError(
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
        raise ConfigError(
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
            raise ConfigError(
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
        if name in PER_RUN_KEYS or key == "seed":
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
        return [Group(run_title(members[0][0].config) or members[0][0].path, {}, tuple(members[0]))]
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
            label = label or run_title(rs[0].config) or rs[0].path
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


def run_title(config: dict[str, Any]) -> str:
    """``"AGENT on ENV"`` (or the dataset) for a run's ``config.json``, as plots title it."""
    agent, env = config.get("agent"), config.get("env") or config.get("dataset")
    return f"{agent} on {env}" if agent and env else (agent or env or "")


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


def same_task(runs: Sequence[Run]) -> bool:
    """True when every run trained the same agent on the same env or dataset."""
    return len({run_title(r.config) for r in runs}) == 1


__all__ = [
    "Group",
    "PER_RUN_KEYS",
    "Run",
    "config_key",
    "final_scores",
    "find_runs",
    "group_runs",
    "load_run",
    "markdown_table",
    "run_title",
    "same_task",
]
