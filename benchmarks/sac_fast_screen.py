"""How ``sac-fast`` was chosen: runs of SAC variants on Hopper-v5 and HalfCheetah-v5.

Each candidate is plain ``jaxrl train sac`` with a few fields changed: LayerNorm critics, an
ensemble of 4 or 3 whose TD target takes the minimum of a random pair and whose actor loss takes
their mean or minimum, 2 or 4 critic steps per env step (4 on half the minibatch, at the same
critic FLOPs), and optionally the actor stepped once per env step. Every candidate trains
``--steps`` env steps per task and seed; the table gives the mean evaluation return over the last
two evaluation points, the updates per second and the wall clock relative to plain SAC on the
task, and every run's evaluation curve (a run stopped by hand keeps its curve).

    .venv/bin/python benchmarks/sac_fast_screen.py --nice            # resumes; writes the table
    .venv/bin/python benchmarks/sac_fast_screen.py --nice --steps 100000 --eval-every 5000 \
        --eval-episodes 10 --seeds 0 --tasks Hopper-v5 --only ln-q3min2-utd4-b128-delayed-pmin

Short runs only rank the candidates; the 100k-step comparison is
``benchmarks/sample_efficiency.py``. Runs live in ``runs/sac_fast_screen/`` and resume when
stopped; the table is ``benchmarks/results/sac_fast_screen.{md,json}`` (another ``--steps``:
``runs/sac_fast_screen/STEPS/`` and ``sac_fast_screen_NK.{md,json}``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from sample_efficiency import curve as eval_curve  # benchmarks/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LN = ("--critic-layer-norm",)
Q4 = ("--num-qs", "4", "--num-min-qs", "2", "--policy-q", "mean")  # RLPD's subset minimum
Q3 = ("--num-qs", "3", "--num-min-qs", "2", "--policy-q", "mean")
CANDIDATES: dict[str, tuple[str, ...]] = {
    "sac": (),
    "ln-q4min2-utd2": (*LN, *Q4, "--utd-ratio", "2"),
    "ln-q4min2-utd2-delayed": (*LN, *Q4, "--utd-ratio", "2", "--delayed-actor-update"),
    # 3 critics instead of 4: the critic work per env step falls from 8 to 6 member passes
    "ln-q3min2-utd2-delayed": (*LN, *Q3, "--utd-ratio", "2", "--delayed-actor-update"),
    # Candidates after sac-fast (the row above) fell short on Hopper-v5 at 100k steps, each at
    # about its wall clock: the actor on the ensemble minimum instead of the mean; two critics
    # (no subset) stepped 3 times per env step; half the batch stepped twice as often.
    "ln-q3min2-utd2-delayed-pmin": (*LN, *Q3[:-1], "min", "--utd-ratio", "2",
                                    "--delayed-actor-update"),
    "ln-q2-utd3-delayed": (*LN, "--utd-ratio", "3", "--delayed-actor-update"),
    "ln-q3min2-utd4-b128-delayed": (*LN, *Q3, "--utd-ratio", "4", "--batch-size", "128",
                                    "--delayed-actor-update"),
    # The critic FLOPs of sac-fast spent on twice the updates of half the batch, actor on the min
    "ln-q3min2-utd4-b128-delayed-pmin": (*LN, *Q3[:-1], "min", "--utd-ratio", "4",
                                         "--batch-size", "128", "--delayed-actor-update"),
    # The preset's Hopper-v5 evaluations swung between ~900 and ~3,300 once it hopped: a slower
    # actor (its steps see 128 rows, half of SAC's)
    "ln-q3min2-utd4-b128-delayed-pmin-alr1e-4": (*LN, *Q3[:-1], "min", "--utd-ratio", "4",
                                                 "--batch-size", "128", "--delayed-actor-update",
                                                 "--actor-lr", "1e-4"),
    # Three quarters of its critic FLOPs: the preset's step once measured 3.4x SAC's wall clock
    "ln-q3min2-utd3-b128-delayed-pmin": (*LN, *Q3[:-1], "min", "--utd-ratio", "3",
                                         "--batch-size", "128", "--delayed-actor-update"),
}  # fmt: skip
TASKS = ("Hopper-v5", "HalfCheetah-v5")
DEFAULT_STEPS = 30_000


def curve(run_dir: str) -> list[tuple[int, float]]:
    """Every (step, evaluation return) of a run's ``metrics.csv``, in order."""
    return list(eval_curve(run_dir).items())


def last_evals(run_dir: str, n: int = 2) -> list[float]:
    """The last ``n`` evaluation returns of a run's ``metrics.csv``."""
    return [v for _, v in curve(run_dir)[-n:]]


def finished(out: str) -> bool:
    """Whether the run directory ``out`` holds a completed run."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return bool(json.load(f).get("completed"))
    except (OSError, ValueError):
        return False


def main() -> int:
    """Run (or resume) every candidate, then write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--only", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="env steps between evaluations (default: a sixth of --steps)",
    )
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--nice", action="store_true", help="run at the lowest CPU priority")
    p.add_argument("--report", action="store_true", help="only write the table of finished runs")
    p.add_argument("--root", default=os.path.join(ROOT, "runs", "sac_fast_screen"))
    a = p.parse_args()
    if a.nice:
        os.nice(19)
    rows = []
    root = a.root if a.steps == DEFAULT_STEPS else os.path.join(a.root, str(a.steps))
    for task in a.tasks:
        for name in a.only:
            for seed in a.seeds:
                out = os.path.join(root, task, name, f"s{seed}")
                cmd = [
                    sys.executable, "-m", "jaxrl.cli", "train", "sac", "--env", task,
                    "--total-steps", str(a.steps),
                    "--eval-every", str(a.eval_every or a.steps // 6),
                    "--eval-episodes", str(a.eval_episodes), "--seed", str(seed), "--out", out,
                    "--no-progress", "--no-tensorboard", *CANDIDATES[name],
                ]  # fmt: skip
                if not finished(out) and not a.report:
                    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
                if not os.path.exists(os.path.join(out, "metrics.csv")):
                    continue
                row = {"task": task, "candidate": name, "seed": seed,
                       "flags": " ".join(CANDIDATES[name]), "curve": curve(out)}  # fmt: skip
                if finished(out):  # a run stopped by hand keeps its curve, in the curves table
                    s = json.load(open(os.path.join(out, "summary.json")))
                    row.update(last_evals=last_evals(out), wall_s=s["wall_clock_s"],
                               updates_per_s=s["updates_per_s"])  # fmt: skip
                rows.append(row)
                print(rows[-1], flush=True)
    if not rows:  # never overwrite a table with an empty one (runs/ is not committed)
        print("no finished runs here: the table is left as it is")
        return 0
    write(rows, a.steps, a.eval_episodes)
    return 0


def write(rows: list[dict], steps: int, episodes: int) -> None:
    """``benchmarks/results/sac_fast_screen[_STEPS].{md,json}``: per candidate and task."""
    results = os.path.join(ROOT, "benchmarks", "results")
    name = "sac_fast_screen" + ("" if steps == DEFAULT_STEPS else f"_{steps // 1000}k")
    with open(os.path.join(results, name + ".json"), "w") as f:
        json.dump({"steps": steps, "runs": rows}, f, indent=1)
    lines = [
        "# Choosing sac-fast: SAC variants" + (", short runs" if steps == DEFAULT_STEPS else ""),
        "",
        f"{steps:,} env steps per run; return: mean of the last two evaluations ({episodes} "
        "episodes each), averaged over seeds; wall: mean wall clock relative to plain SAC on the "
        "task. These runs shared the 2 cores with other jobs, so the wall ratios and updates/s "
        "say little; the speed measured side "
        "by side is `benchmarks/sample_efficiency.py --speed`.",
        "",
        "| task | candidate | flags | seeds | return | per seed | updates/s | wall vs sac |",
        "|---|---|---|---|---|---|---|---|",
    ]
    done = [r for r in rows if "wall_s" in r]
    for task in TASKS:
        base = [r["wall_s"] for r in done if r["task"] == task and r["candidate"] == "sac"]
        for cand in CANDIDATES:
            rs = [r for r in done if r["task"] == task and r["candidate"] == cand]
            if not rs:
                continue
            per = [sum(r["last_evals"]) / len(r["last_evals"]) for r in rs]
            wall = sum(r["wall_s"] for r in rs) / len(rs)
            ratio = f"{wall / (sum(base) / len(base)):.2f}x" if base else "-"
            ups = sum(r["updates_per_s"] for r in rs) / len(rs)
            lines.append(
                f"| {task} | {cand} | `{rs[0]['flags'] or '(defaults)'}` | {len(rs)} | "
                f"{sum(per) / len(per):,.0f} | {', '.join(f'{v:,.0f}' for v in per)} | "
                f"{ups:.0f} | {ratio} |"
            )
    lines += ["", "Evaluation return at each evaluation (env steps in thousands):", "",
              "| task | candidate | seed | curve |", "|---|---|---|---|"]  # fmt: skip
    for r in rows:
        stopped = "" if "wall_s" in r else f" (stopped at {r['curve'][-1][0] // 1000}k)"
        points = ", ".join(f"{st // 1000}k: {v:,.0f}" for st, v in r["curve"])
        lines.append(f"| {r['task']} | {r['candidate']} | {r['seed']}{stopped} | {points} |")
    with open(os.path.join(results, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
