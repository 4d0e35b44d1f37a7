"""Wall-clock of a 16-member vmapped sweep against 16 sequential runs of the same members.

Two cases, each measured in one process on this machine, one after the other:

* ``sac``: SAC on ``jax:pendulum`` (fused loop, 1 env per member, 1 update per step, paper
  networks 256x256, batch 256), ``actor_lr`` x ``tau`` (2 x 2) x 4 seeds.
* ``iql``: IQL on a HalfCheetah-v5 dataset (a D4RL-layout HDF5 file made by another library,
  100k rows, given with ``--data`` or ``JAXRL_REFERENCE_DATASET``; paper networks),
  ``expectile`` x ``actor_lr`` (2 x 2) x 4 seeds, evaluated on HalfCheetah-v5.

"vmapped" is ``jaxrl.tune.grid.sweep`` (one program per chunk length for all 16 members).
"sequential" is ``jaxrl.run.train`` called 16 times in the same process, as a user's loop over
settings and seeds would: runs that share a config (the seeds of one setting) reuse the
compiled programs, so this is the sequential baseline's best case. Both include compilation,
dataset loading and the evaluations.

What 2 CPU cores can show: a member's update is compute-bound, so 16 members in one program do
not train 16x faster; what the vmapped sweep saves here is compilation (once instead of once
per setting), dispatch (one call per chunk for all members) and the dataset load. On an
accelerator the members' updates also run in parallel.

Usage:
    .venv/bin/python benchmarks/sweeps.py [--only sac,iql] [--steps N] [--out DIR]

Writes benchmarks/results/sweeps.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time

import jax

from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.run import train
from jaxrl.tune.grid import parse_grid, settings, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The reference dataset: a D4RL-layout HDF5 file of HalfCheetah-v5 made by another library.
DATA = os.environ.get("JAXRL_REFERENCE_DATASET", "")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
SEEDS = [0, 1, 2, 3]

CASES = {
    "sac": {
        "agent": "sac",
        "grid": ["actor_lr=3e-4,1e-3", "tau=0.005,0.01"],
        "args": lambda steps, data: [
            "--env",
            "jax:pendulum",
            "--num-envs",
            "1",
            "--total-steps",
            str(steps),
            "--learning-starts",
            str(steps // 2),
            "--eval-every",
            str(steps),
            "--log-every",
            str(steps // 4),
            "--eval-episodes",
            "5",
        ],  # fmt: skip
        "steps": 2_000,
        "what": "SAC, jax:pendulum, 1 env/member, 1 update/step, 256x256, batch 256",
    },
    "iql": {
        "agent": "iql",
        "grid": ["expectile=0.7,0.9", "actor_lr=3e-4,1e-4"],
        "args": lambda steps, data: [
            "--dataset",
            data,
            "--env",
            "HalfCheetah-v5",
            "--total-steps",
            str(steps),
            "--eval-every",
            str(steps),
            "--log-every",
            str(steps // 4),
            "--eval-episodes",
            "2",
        ],  # fmt: skip
        "steps": 2_000,
        "what": "IQL, HalfCheetah-v5 dataset of another library (100k rows), 256x256, batch 256",
    },
}


def run_case(name: str, steps: int | None, data: str = DATA) -> dict:
    """Time the vmapped sweep, then the sequential runs, of one case."""
    case = CASES[name]
    steps = steps or case["steps"]
    spec = registry.get(case["agent"])
    common = [*case["args"](steps, data), "--no-progress", "--no-tensorboard"]
    train_cfg, base = parse_train_args(case["agent"], common)
    grid = parse_grid(case["grid"], spec.config)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = sweep(spec, train_cfg, base, grid, SEEDS, os.path.join(tmp, "sweep"))
        vmapped = time.perf_counter() - t0
        t0 = time.perf_counter()
        finals = []
        for setting in settings(grid):
            for seed in SEEDS:
                out = os.path.join(tmp, "seq", f"{len(finals)}")
                cfg = dataclasses.replace(train_cfg, seed=seed, out=out)
                summary = train(case["agent"], cfg, dataclasses.replace(base, **setting))
                finals.append(summary["final_eval_return_mean"])
        sequential = time.perf_counter() - t0
    sweep_finals = [r for row in result["settings"] for r in row["returns"]]
    row = {
        "case": name,
        "what": case["what"],
        "members": len(finals),
        "steps_per_member": steps,
        "programs": result["programs"],
        "vmapped_s": round(vmapped, 1),
        "sequential_s": round(sequential, 1),
        "speedup": round(sequential / vmapped, 2),
        "sweep_final_mean": sum(sweep_finals) / len(sweep_finals),
        "sequential_final_mean": sum(finals) / len(finals),
    }
    print(json.dumps(row))
    return row


def write(rows: list[dict], out: str) -> None:
    """Markdown and JSON tables in ``out``."""
    os.makedirs(out, exist_ok=True)
    meta = {"machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
            "jax": jax.__version__}  # fmt: skip
    with open(os.path.join(out, "sweeps.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    lines = [
        "# Sweeps: 16 members vmapped in one program vs 16 sequential runs",
        "",
        f"Machine: {meta['machine']}, jax {meta['jax']}. Both include compilation, data loading "
        "and evaluation; the sequential runs are `jaxrl.run.train` in one process (the seeds of "
        "a setting reuse its compiled programs).",
        "",
        "| case | members | steps each | programs | vmapped (s) | sequential (s) | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['members']} | {r['steps_per_member']} | {r['programs']} | "
            f"{r['vmapped_s']} | {r['sequential_s']} | {r['speedup']}x |"
        )
    lines += [
        "",
        "Mean final return over the 16 members, vmapped / sequential (the same members: they "
        "start equal and differ by float rounding, which 2,000 updates and a 1-2 episode "
        "evaluation amplify): "
        + "; ".join(
            f"{r['case']} {r['sweep_final_mean']:.1f} / {r['sequential_final_mean']:.1f}"
            for r in rows
        ),
        "",
        "On 2 CPU cores a member's update is compute-bound: the members do not train in parallel "
        "for free. The saving measured here is compilation (once per program instead of once "
        "per setting), per-call dispatch and the dataset load.",
        "",
        "Regenerate: `.venv/bin/python benchmarks/sweeps.py`",
    ]
    with open(os.path.join(out, "sweeps.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run the cases and write the tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    p.add_argument("--steps", type=int, default=None, help="steps per member (default per case)")
    p.add_argument("--out", default=RESULTS)
    p.add_argument(
        "--data",
        default=DATA,
        help="D4RL-layout HDF5 file of HalfCheetah-v5 for the iql case "
        "(default: $JAXRL_REFERENCE_DATASET)",
    )
    a = p.parse_args()
    if "iql" in a.only.split(",") and not os.path.exists(a.data):
        p.error("the iql case needs --data FILE or JAXRL_REFERENCE_DATASET (D4RL-layout HDF5)")
    rows = [run_case(name, a.steps, a.data) for name in a.only.split(",")]
    write(rows, a.out)


if __name__ == "__main__":
    main()
