"""Offline agents on data another library made: a HalfCheetah-v5 dataset of a SAC policy.

Trains each agent with ``jaxrl train AGENT --dataset FILE --env HalfCheetah-v5`` at its paper
defaults for a CPU-sized budget of gradient steps, then tabulates the final evaluation return and
the D4RL-normalized score next to the dataset's own behavior return. This checks the D4RL reader
and the agents end to end on a file made by another library; it is not a test (minutes per
agent) and the budgets are far below the papers' 1M steps.

The dataset is a D4RL-layout HDF5 file of HalfCheetah-v5 made by another library (e.g. 100
episodes of a Stable-Baselines-Jax SAC policy), given with ``--data`` or the
``JAXRL_REFERENCE_DATASET`` environment variable.

Usage:
    .venv/bin/python benchmarks/offline_learning.py [--agents bc:30000,td3-bc:50000,iql:50000]
        [--data PATH] [--eval-episodes 5] [--runs DIR] [--out DIR]

Writes benchmarks/results/offline_learning.{md,json}. Cut runs resume and finished ones are
read back, so rerunning the same command finishes an interrupted benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from jaxrl.data import load_d4rl, normalized_score, reference_returns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The reference dataset: a D4RL-layout HDF5 file of HalfCheetah-v5 made by another library.
DATA = os.environ.get("JAXRL_REFERENCE_DATASET", "")
ENV = "HalfCheetah-v5"


def _finished(summary_path: str, steps: int) -> bool:
    """Whether ``summary_path`` records a completed run of ``steps`` gradient steps.

    Resuming a completed run would overwrite its timing with that of a zero-step run, so
    finished runs are read, not rerun.
    """
    if not os.path.exists(summary_path):
        return False
    with open(summary_path) as f:
        s = json.load(f)
    return bool(s.get("completed")) and s.get("total_steps") == steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="bc:30000,td3-bc:50000,iql:50000", help="NAME:STEPS,...")
    p.add_argument(
        "--data", default=DATA, help="D4RL-layout HDF5 file (default: $JAXRL_REFERENCE_DATASET)"
    )
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--runs", default=os.path.join(ROOT, "runs", "offline_learning"))
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if not os.path.exists(args.data):
        raise SystemExit(
            f"{args.data!r} not found: give a D4RL-layout HDF5 file of {ENV} with --data or "
            "JAXRL_REFERENCE_DATASET."
        )
    returns = load_d4rl(args.data, ENV).episode_returns()
    refs = reference_returns(ENV)
    rows = []
    for item in args.agents.split(","):
        name, steps = item.split(":")
        out = os.path.join(args.runs, name)
        cmd = [os.path.join(os.path.dirname(sys.executable), "jaxrl"), "train", name]
        cmd += ["--dataset", args.data, "--env", ENV, "--total-steps", steps, "--out", out]
        cmd += ["--eval-every", str(max(1, int(steps) // 5)), "--log-every", "5000"]
        cmd += ["--eval-episodes", str(args.eval_episodes), "--no-progress", "--seed", "0"]
        summary_path = os.path.join(out, "summary.json")
        if _finished(summary_path, int(steps)):
            print(f"{name}: finished run in {out}, not retrained", flush=True)
        else:
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        with open(summary_path) as f:
            s = json.load(f)
        rows.append(
            {
                "agent": name,
                "gradient_steps": s["total_steps"],
                "return_mean": round(s["final_eval_return_mean"], 1),
                "return_std": round(s["final_eval_return_std"], 1),
                "normalized_score": round(s["normalized_score"], 1),
                "updates_per_s": round(s["updates_per_s"], 1),
                "wall_clock_s": s["wall_clock_s"] and round(s["wall_clock_s"]),
            }
        )
    behavior = float(returns.mean())
    lines = [
        f"# Offline agents on {os.path.basename(args.data)} ({ENV})",
        "",
        f"Dataset: {len(returns)} episodes, behavior return {behavior:,.0f} ± {returns.std():,.0f}"
        f" (normalized {normalized_score(behavior, refs):.1f} with D4RL's halfcheetah "
        "references); made by another library (a Stable-Baselines-Jax SAC policy). Paper "
        f"defaults, seed 0, final deterministic evaluation over {args.eval_episodes} episodes.",
        "",
        "| agent | gradient steps | return | normalized score | updates/s (with evals) | wall |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['agent']} | {r['gradient_steps']:,} | {r['return_mean']:,.0f} ± "
            f"{r['return_std']:,.0f} | {r['normalized_score']} | {r['updates_per_s']} | "
            f"{r['wall_clock_s']} s |"
        )
    lines += ["", "Regenerate: `.venv/bin/python benchmarks/offline_learning.py`", ""]
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "offline_learning.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "offline_learning.json"), "w") as f:
        json.dump({"data": args.data, "behavior_return": behavior, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
