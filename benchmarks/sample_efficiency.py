"""Sample efficiency beside SBX: jaxrl SAC, CrossQ and sac-fast, and SBX's SAC and CrossQ.

HalfCheetah-v5 and Hopper-v5, seeds 0-2, 100k env steps each: the results suite's online cells
(``benchmarks/suite.py``), so the runs resume when stopped and finished runs are archived and
committed. This script runs those cells (``--run``, at nice 19, committing after each run) and
writes the table of returns at 20k, 50k and 100k env steps per seed, with each run's wall clock:

    .venv/bin/python benchmarks/sample_efficiency.py --run    # resumable; hours on 2 CPU cores
    .venv/bin/python benchmarks/sample_efficiency.py          # the table from what has finished
    .venv/bin/python benchmarks/sample_efficiency.py --speed  # seconds per env step, side by side
    .venv/bin/python benchmarks/sample_efficiency.py --pendulum  # CrossQ vs SBX's, Pendulum-v1

``--speed`` measures the wall clock per env step of jaxrl's three agents and SBX's SAC and
CrossQ (at the same settings, with the peer virtualenv of ``make peers``) on Hopper-v5 one after
the other on an otherwise idle machine: two runs per agent (1,000 random steps, then 1,000 or
2,500 training steps), the difference of their wall clocks over the 1,500 extra steps, so
compilation and warm-up cancel; the median of ``--rounds`` passes (2), each shown, since one
pass's figures moved by up to 30% between passes. ``--pendulum`` runs jaxrl's and SBX's CrossQ
at their default sizes on Pendulum-v1 (5,000 steps, 1,000 random, seeds 0-1; resumable in
``runs/crossq_pendulum``): a small-task check that both learn alike.

Writes ``benchmarks/results/sample_efficiency.{md,json,png}``. A cell with fewer than three
finished seeds says so; nothing missing is filled in.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

import numpy as np
from suite import ROOT, full_suite  # benchmarks/ is on sys.path as a script
from suite_state import archive_dir, cpu_model, finished_dir

TASKS = ("HalfCheetah-v5", "Hopper-v5")
ROWS = (("jaxrl", "sac"), ("sbx-rl", "sac"), ("jaxrl", "crossq"), ("sbx-rl", "crossq"),
        ("jaxrl", "sac-fast"))  # fmt: skip
POINTS = (20_000, 50_000, 100_000)
PUBLISHED = {  # SimbaV2's baseline tables, MuJoCo v4, 10 seeds, 100k steps (other hardware)
    ("HalfCheetah-v5", "sac"): 6156, ("HalfCheetah-v5", "crossq"): 8112,
    ("Hopper-v5", "sac"): 1103, ("Hopper-v5", "crossq"): 2764,
}  # fmt: skip


def curve(run_dir: str) -> dict[int, float]:
    """``{step: eval_return}`` of a run directory (or its archive)."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval_return")]
    return {int(float(r["step"])): float(r["eval_return"]) for r in rows}


def collect(root: str, results: str) -> list[dict]:
    """One dict per (task, library, agent): per-seed curves, returns at ``POINTS``, wall clock."""
    runs = [r for r in full_suite() if r.section == "online"]
    archive = archive_dir(results, "full")
    cells = []
    for task in TASKS:
        for impl, agent in ROWS:
            cell = {"task": task, "impl": impl, "agent": agent, "seeds": {}}
            for r in runs:
                if (r.task, r.impl, r.agent) != (task, impl, agent):
                    continue
                found = finished_dir(r, root, archive)
                if found is None:
                    continue
                summary = json.load(open(os.path.join(found, "summary.json")))
                c = curve(found)
                cell["seeds"][r.seed] = {
                    "curve": c,
                    "at": {p: c.get(p) for p in POINTS},
                    "wall_s": summary.get("wall_clock_s"),
                }
            cells.append(cell)
    return cells


def _int_keys(curve: dict) -> list[tuple[int, float]]:
    """A curve's ``(step, return)`` pairs (JSON turns its int keys into strings)."""
    return [(int(k), v) for k, v in curve.items()]


def _stat(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{np.mean(values):,.0f} ± {np.std(values):,.0f}"


def _ms(seconds: list[float]) -> str:
    """Seconds as comma-separated milliseconds."""
    return ", ".join(f"{1e3 * x:.1f}" for x in seconds)


def write(
    cells: list[dict], results: str, measured: dict | None = None, pend: list | None = None
) -> None:
    """The markdown table, the JSON and the learning-curve plot (``--speed``, ``--pendulum``)."""
    lines = [
        "# Sample efficiency: jaxrl SAC, CrossQ and sac-fast beside SBX",
        "",
        "Mean ± std over seeds of the evaluation return (10 deterministic episodes) at 20k, 50k "
        "and 100k env steps; wall: mean wall clock of a finished 100k-step run on this "
        "machine's 2 CPU cores, over every segment of a resumed run. The runs go at low priority "
        "beside other work, so this column is their cost, not a speed comparison: speed is the "
        "side-by-side table below. Published: SimbaV2's baseline tables (MuJoCo v4, other "
        "hardware, 10 seeds).",
        "",
        "| task | library | agent | seeds | 20k | 50k | 100k | per seed at 100k | wall per run "
        "| published (v4) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        seeds = c["seeds"]
        at = {p: [s["at"][p] for s in seeds.values() if s["at"][p] is not None] for p in POINTS}
        walls = [s["wall_s"] for s in seeds.values() if s["wall_s"]]
        per = ", ".join(f"s{k}: {v['at'][100_000]:,.0f}" for k, v in sorted(seeds.items()))
        pub = PUBLISHED.get((c["task"], c["agent"])) if c["impl"] == "jaxrl" else None
        lines.append(
            f"| {c['task']} | {c['impl']} | {c['agent']} | {len(seeds)}/3 | "
            + " | ".join(_stat(at[p]) for p in POINTS)
            + f" | {per or '-'} | {f'{np.mean(walls) / 60:.0f} min' if walls else '-'} | "
            f"{f'{pub:,}' if pub else ''} |"
        )
    if measured:
        lines += [
            "",
            "Wall clock per training env step on Hopper-v5, measured side by side "
            f"({measured['cpu']}, `--speed`):",
            "",
            "| library | agent | ms per env step (each round) | vs jaxrl SAC |",
            "|---|---|---|---|",
            *(f"| {r.get('impl', 'jaxrl')} | {r['agent']} | {1e3 * r['s_per_step']:.1f} "
              f"({_ms(r.get('rounds_s_per_step', [r['s_per_step']]))}) | {r['vs_sac']:.2f}x |"
              for r in measured["rows"]),
        ]  # fmt: skip
    if pend:
        steps = sorted({int(k) for r in pend for k in r["curve"]})
        lines += [
            "",
            "CrossQ on Pendulum-v1 at each library's default sizes (`--pendulum`; 1,000 random "
            "steps, evaluation return over 10 episodes):",
            "",
            "| library | seed | " + " | ".join(f"{t:,}" for t in steps) + " |",
            "|---|---|" + "---|" * len(steps),
            *(f"| {r['impl']} | {r['seed']} | "
              + " | ".join(f"{dict(_int_keys(r['curve']))[t]:,.0f}" for t in steps) + " |"
              for r in pend),
        ]  # fmt: skip
    with open(os.path.join(results, "sample_efficiency.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(results, "sample_efficiency.json"), "w") as f:
        json.dump({"points": POINTS, "cells": cells}, f, indent=1)
    _plot(cells, os.path.join(results, "sample_efficiency.png"))


def _plot(cells: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(6 * len(TASKS), 4))
    for ax, task in zip(np.atleast_1d(axes), TASKS, strict=True):
        for c in (c for c in cells if c["task"] == task and c["seeds"]):
            steps = sorted(set.intersection(*(set(s["curve"]) for s in c["seeds"].values())))
            ys = np.array([[s["curve"][t] for t in steps] for s in c["seeds"].values()])
            label = f"{c['impl']} {c['agent']} (n={len(ys)})"
            ax.plot(steps, ys.mean(0), label=label, ls="-" if c["impl"] == "jaxrl" else "--")
            ax.fill_between(steps, ys.min(0), ys.max(0), alpha=0.15)
        ax.set_title(task)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (seed mean; band: min-max)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


PEERS_PYTHON = os.path.join(ROOT, ".venv-peers", "bin", "python")


def _train_cmd(
    impl: str, agent: str, env: str, total: int, out: str, seed: int, every: int, episodes: int
) -> list[str]:
    """The command of one run of jaxrl's CLI or of SBX's peer script (1,000 random steps)."""
    common = ["--learning-starts", "1000", "--out", out, "--seed", str(seed),
              "--eval-every", str(every), "--eval-episodes", str(episodes)]  # fmt: skip
    if impl == "jaxrl":
        return [sys.executable, "-m", "jaxrl.cli", "train", agent, "--env", env, "--total-steps",
                str(total), *common, "--no-progress", "--no-tensorboard"]  # fmt: skip
    script = os.path.join(ROOT, "benchmarks", "peers", "suite_sbx.py")
    return [PEERS_PYTHON, script, "--algo", agent, "--env", env, "--steps", str(total), *common]


def pendulum(root: str) -> list[dict]:
    """CrossQ of jaxrl and SBX on Pendulum-v1, seeds 0-1: evaluation curves (see above)."""
    rows = []
    for seed in (0, 1):
        for impl in ("jaxrl", "sbx-rl"):
            out = os.path.join(root, impl, f"s{seed}")
            if not os.path.exists(os.path.join(out, "summary.json")):
                cmd = _train_cmd(impl, "crossq", "Pendulum-v1", 5_000, out, seed, 1_000, 10)
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
            rows.append({"impl": impl, "seed": seed, "curve": curve(out)})
    return rows


SPEED_AGENTS = (("jaxrl", "sac"), ("jaxrl", "sac-fast"), ("jaxrl", "crossq"),
                ("sbx-rl", "sac"), ("sbx-rl", "crossq"))  # fmt: skip


def speed(tmp: str, rounds: int = 1) -> list[dict]:
    """Seconds per training env step of each agent on Hopper-v5 (see the module docstring).

    ``rounds`` passes over all agents, one after the other in each: a row's figure is the median,
    with each round's in ``rounds_s_per_step``. SBX's rows need the peer virtualenv
    (``make peers``) and are left out without it.
    """
    agents = [(i, a) for i, a in SPEED_AGENTS if i == "jaxrl" or os.path.exists(PEERS_PYTHON)]
    per: dict[tuple[str, str], list[float]] = {k: [] for k in agents}
    for r in range(rounds):
        for impl, agent in agents:
            wall = {}
            for n in (1_000, 2_500):
                out = os.path.join(tmp, str(r), impl, agent, str(n))
                cmd = _train_cmd(impl, agent, "Hopper-v5", 1_000 + n, out, 0, 1_000 + n, 1)
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
                wall[n] = json.load(open(os.path.join(out, "summary.json")))["wall_clock_s"]
            per[(impl, agent)].append((wall[2_500] - wall[1_000]) / 1_500)
    rows = [
        {"impl": i, "agent": a, "s_per_step": float(np.median(v)), "rounds_s_per_step": v}
        for (i, a), v in per.items()
    ]
    base = rows[0]["s_per_step"]
    for r in rows:
        r["vs_sac"] = r["s_per_step"] / base
    return rows


def main() -> int:
    """Optionally run the cells (resumable), then write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="store_true", help="run the unfinished cells first (nice 19)")
    p.add_argument("--speed", action="store_true", help="measure the seconds per env step")
    p.add_argument("--rounds", type=int, default=2, help="--speed: passes over the agents")
    p.add_argument("--pendulum", action="store_true", help="CrossQ vs SBX's on Pendulum-v1")
    p.add_argument("--root", default=os.path.join(ROOT, "runs", "suite"))
    p.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    a = p.parse_args()
    if a.run:
        only = [f"online/{t}/{i}-{g}/*" for t in TASKS for i, g in ROWS]
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "suite.py"), "--nice", "--commit"]
        cmd += ["--root", a.root, "--results", a.results]
        subprocess.run(cmd + [x for o in only for x in ("--only", o)], check=False)
    speed_json = os.path.join(a.results, "sample_efficiency_speed.json")
    if a.speed:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            rows = speed(tmp, a.rounds)
        with open(speed_json, "w") as f:
            json.dump({"cpu": cpu_model(), "rows": rows}, f, indent=1)
    measured = json.load(open(speed_json)) if os.path.exists(speed_json) else None
    pend_json = os.path.join(a.results, "sample_efficiency_pendulum.json")
    if a.pendulum:
        with open(pend_json, "w") as f:
            json.dump(pendulum(os.path.join(ROOT, "runs", "crossq_pendulum")), f, indent=1)
    pend = json.load(open(pend_json)) if os.path.exists(pend_json) else None
    write(collect(a.root, a.results), a.results, measured, pend)
    print(os.path.join(a.results, "sample_efficiency.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
