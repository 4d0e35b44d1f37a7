"""Tables and plots of the results suite (``benchmarks/suite.py``), from its run directories.

Which runs are finished, and the archive of finished runs, are ``suite_state.py``'s.

A cell is one (section, task, library, agent) with its seeds. Its figures come from each finished
run's ``summary.json``: the final evaluation's mean return (``EVAL_EPISODES`` deterministic
episodes), the D4RL-normalized score where the task has references (an online run archived
before jaxrl's host loop wrote it gets it from its return), and the wall time (the table
shows the seeds' median). A cell
with fewer finished seeds than declared says so; nothing missing is filled in.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import numpy as np
from suite_state import MACHINE, archive_dir, cpu_model, finished_dir, read_json

from jaxrl.data import normalized_score, reference_returns

SECTIONS = {
    "online": "Online, Gymnasium MuJoCo",
    "ppo": "PPO in the fused loop, Brax (MJX)",
    "datasets": "Datasets (generated the D4RL way)",
    "offline": "Offline",
    "o2o": "Offline-to-online",
    "planners": "Planners",
}
PEER_CHECK = "jaxrl mean >= peer mean - peer std"


def collect(runs: list, root: str, archive: str) -> list[dict[str, Any]]:
    """One dict per cell: its runs' final returns, normalized scores and wall times."""
    cells: dict[tuple, dict[str, Any]] = {}
    for r in runs:
        key = (r.section, r.task, r.impl, r.agent)
        cell = cells.setdefault(
            key,
            {
                "section": r.section,
                "task": r.task,
                "impl": r.impl,
                "agent": r.agent,
                "budget": r.budget,
                "unit": r.unit,
                "seeds": [],
                "returns": [],
                "normalized": [],
                "wall_s": [],
                "dirs": [],
                "machines": [],
                "missing": [],
            },
        )
        out = finished_dir(r, root, archive)
        if out is None:
            cell["missing"].append(r.seed)
            continue
        summary = read_json(os.path.join(out, r.marker)) or {}
        cell["seeds"].append(r.seed)
        cell["dirs"].append(out)
        # A dataset remade here with the archived files keeps the machine of record.
        machine = read_json(os.path.join(out, MACHINE)) or read_json(
            os.path.join(archive, r.name, MACHINE)
        )
        cell["machines"].append(machine_label(machine or {}))
        if r.section == "datasets":  # the recipe's manifest; its time is the expert run's
            cell["manifest"] = summary
            expert = read_json(os.path.join(out, summary.get("expert_run", ""), "summary.json"))
            cell["wall_s"].append(float((expert or {}).get("wall_clock_s") or 0.0))
            continue
        cell["wall_s"].append(float(summary.get("wall_clock_s") or 0.0))
        cell["returns"].append(float(summary["final_eval_return_mean"]))
        score = summary.get("normalized_score")
        if score is None and r.section == "online":  # runs of a jaxrl that did not score online
            score = normalized_score(summary["final_eval_return_mean"], reference_returns(r.task))
        cell["normalized"].append(None if score is None else float(score))
    for cell in cells.values():
        rets = np.array(cell["returns"])
        cell["mean"] = float(rets.mean()) if len(rets) else None
        cell["std"] = float(rets.std()) if len(rets) else None
        scores = [s for s in cell["normalized"] if s is not None]
        cell["normalized_mean"] = float(np.mean(scores)) if scores else None
    _peer_checks(list(cells.values()))
    return list(cells.values())


def _peer_checks(cells: list[dict[str, Any]]) -> None:
    """Mark each jaxrl cell that has a peer beside it: is its mean within one peer std?"""
    peers = {(c["section"], c["task"], c["agent"]): c for c in cells if c["impl"] != "jaxrl"}
    for c in cells:
        p = peers.get((c["section"], c["task"], c["agent"]))
        if c["impl"] != "jaxrl" or p is None:
            continue
        if c["missing"] or p["missing"]:
            c["vs_peer"] = "incomplete"
        else:
            ok = c["mean"] >= p["mean"] - p["std"]
            c["vs_peer"] = "ok" if ok else "below (see *Below a peer*)"
        c["peer"] = p["impl"]


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _rows(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| task | library | agent | seeds | return (mean ± std) | per seed | normalized | "
        f"budget | wall per run | {PEER_CHECK} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        n, total = len(c["seeds"]), len(c["seeds"]) + len(c["missing"])
        per_seed = ", ".join(
            f"s{s}: {v:,.0f}" for s, v in zip(c["seeds"], c["returns"], strict=True)
        )
        ret = "not run yet" if not n else f"{c['mean']:,.1f} ± {c['std']:,.1f}"
        # The median: a run that shared the CPU with other work reads slow, and one such run
        # should not speak for the cell.
        wall = f"{np.median(c['wall_s']) / 60:.0f} min" if c["wall_s"] else "-"
        lines.append(
            f"| {c['task']} | {c['impl']} | {c['agent']} | {n}/{total} | {ret} | {per_seed or '-'}"
            f" | {_fmt(c['normalized_mean'])} | {c['budget']:,} {c['unit']} | {wall} | "
            f"{c.get('vs_peer', '')} |"
        )
    return lines


def _dataset_rows(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| env | expert budget | random return | expert return (step) | medium step (return) | "
        "file | transitions | episodes | return | sha256 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        m = c.get("manifest")
        if not m:
            lines.append(f"| {c['task']} | {c['budget']:,} | not made yet | | | | | | | |")
            continue
        for kind, f in m["files"].items():
            lines.append(
                f"| {c['task']} | {m['expert_steps']:,} | {_fmt(m['random_return'])} | "
                f"{_fmt(m['expert_return'])} ({m.get('expert_step', m['expert_steps']):,}) | "
                f"{m['medium_step']:,} ({_fmt(m['medium_return'])}) "
                f"| {kind} | {f.get('transitions', 0):,} | {f.get('episodes', '-')} | "
                f"{_fmt(f.get('return_mean'))} | `{f.get('sha256', '')}` |"
            )
    return lines


def _plots(cells: list[dict[str, Any]], results: str) -> list[str]:
    """Per-task learning curves, one line per cell (mean, 95% CI over seeds); per section, IQM.

    The runs of a cell are its seeds by construction, so they are grouped by cell and labelled
    ``library agent``, not by ``jaxrl plot``'s comparison of configs (which would label a line by
    every setting in which two libraries' configs differ).
    """
    from jaxrl.analysis.curves import Group, learning_curve, load_run, plot_groups

    written = []
    tasks: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for c in cells:
        if c["section"] == "datasets":
            continue
        # Runs recovered without their curves (only a summary) are in the table, not here.
        runs = [load_run(d) for d in c["dirs"] if os.path.isfile(os.path.join(d, "metrics.csv"))]
        runs = [r for r in runs if r is not None]
        if runs:
            label = f"{c['impl']} {c['agent']}"
            tasks[(c["section"], c["task"])].append(Group(label, {}, tuple(runs)))
    for (section, task), groups in sorted(tasks.items()):
        png = os.path.join(results, f"suite_{section}_{task.replace(':', '-')}.png")
        curves = [learning_curve(g, n_boot=2000, seed=0) for g in groups]
        plot_groups(groups, curves, png, task)
        written.append(png)
    for section in SECTIONS:
        png = _iqm_plot([c for c in cells if c["section"] == section], section, results)
        if png:
            written.append(png)
    return written


def _iqm_plot(cells: list[dict[str, Any]], section: str, results: str) -> str | None:
    """IQM of the normalized scores over tasks x seeds, with 95% bootstrap CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxrl.analysis.stats import bootstrap_ci, iqm

    scores: dict[str, list[float]] = defaultdict(list)
    for c in cells:
        scores[f"{c['impl']} {c['agent']}"] += [s for s in c["normalized"] if s is not None]
    scores = {k: v for k, v in scores.items() if v}
    if not scores:
        return None
    labels = sorted(scores)
    stats = [bootstrap_ci(np.array(scores[k]), iqm, n_boot=2000, seed=0) for k in labels]
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(labels) + 1.2))
    y = np.arange(len(labels))
    pts = np.array([s[0] for s in stats])
    err = np.array([[s[0] - s[1], s[2] - s[0]] for s in stats]).T
    ax.barh(y, pts, xerr=err, color="tab:blue", alpha=0.7, capsize=3)
    ax.set_yticks(y, [f"{k} (n={len(scores[k])})" for k in labels])
    ax.set_xlabel("normalized score, IQM over tasks x seeds (95% bootstrap CI)")
    ax.set_title(SECTIONS[section])
    fig.tight_layout()
    png = os.path.join(results, f"suite_iqm_{section}.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def machine_label(machine: dict[str, Any]) -> str | None:
    """A ``machine.json``'s CPU, with its kind where recorded: one name covers several kinds."""
    cpu, kind = machine.get("cpu"), machine.get("kind")
    return f"{cpu} [{kind}]" if cpu and kind else cpu


def _machines(cells: list[dict[str, Any]]) -> str:
    """Which CPUs finished the runs, with how many each (``machine.json`` beside each run)."""
    counts: dict[str, int] = defaultdict(int)
    for c in cells:
        for cpu in c["machines"]:
            counts[cpu or "not recorded"] += 1
    if not counts:
        return f"Machine: {cpu_model()}"
    ranked = sorted(counts.items(), key=lambda x: -x[1])
    mix = "; ".join(f"{cpu} ({n} run{'s' * (n != 1)})" for cpu, n in ranked)
    return f"Machines that finished the runs: {mix}"


def write_report(runs: list, root: str, results: str, suite: str) -> list[str]:
    """Write ``suite.md``, ``suite.json`` and the plots into ``results``; return their paths."""
    cells = collect(runs, root, archive_dir(results, suite))
    os.makedirs(results, exist_ok=True)
    plots = _plots(cells, results) if suite == "full" else []  # first: the table links them
    stem = "suite" if suite == "full" else f"suite_{suite}"
    done = sum(len(c["seeds"]) for c in cells)
    total = done + sum(len(c["missing"]) for c in cells)
    hours = sum(sum(c["wall_s"]) for c in cells) / 3600
    lines = [
        "# Results: jaxrl beside the peer libraries",
        "",
        f"{done} of {total} runs finished ({hours:.1f} wall-clock hours so far on "
        f"{os.cpu_count()} CPU cores, {hours * (os.cpu_count() or 1):.1f} CPU-hours). "
        f"{_machines(cells)}, no GPU. Every figure comes from a run directory made by "
        "`benchmarks/suite.py`; a cell with fewer seeds than declared is incomplete, never "
        "filled in. Return: the final evaluation's mean over 10 deterministic episodes; "
        "normalized: D4RL's score (the generated datasets' own random and expert returns); "
        "wall per run: the median over the seeds (runs of this suite often shared the CPU with "
        "other work, so compare speeds in the side-by-side benchmarks, not here). "
        "Where a jaxrl mean falls below the peer's mean minus one std, the results page "
        "(`docs/results.md`, *Below a peer*) compares the seeds' curves and the two "
        "implementations.",
        "",
    ]
    for section, title in SECTIONS.items():
        part = [c for c in cells if c["section"] == section]
        if not part:
            continue
        lines += [f"## {title}", ""]
        lines += _dataset_rows(part) if section == "datasets" else _rows(part)
        png = f"suite_iqm_{section}.png"
        lines.append("")
        if suite == "full" and any(c["normalized_mean"] is not None for c in part):
            lines += [f"![IQM of the normalized scores]({png})", ""]
        for task in dict.fromkeys(c["task"] for c in part if c["dirs"]):
            png = f"suite_{section}_{task.replace(':', '-')}.png"
            if (
                section != "datasets"
                and suite == "full"
                and os.path.isfile(os.path.join(results, png))
            ):
                lines += [f"![{task}]({png})", ""]
    lines += [
        "Rerun one cell (it resumes; finished runs are skipped): "
        "`.venv/bin/python benchmarks/suite.py --only 'online/Hopper-v5/jaxrl-sac/*'`; "
        "`--list` shows every run's state.",
        "",
    ]
    md, js = os.path.join(results, f"{stem}.md"), os.path.join(results, f"{stem}.json")
    with open(md + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(md + ".tmp", md)
    with open(js + ".tmp", "w") as f:
        json.dump({"cpu": cpu_model(), "cores": os.cpu_count(), "cells": cells}, f, indent=1)
    os.replace(js + ".tmp", js)
    return [md, js, *plots]
