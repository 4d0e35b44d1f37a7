"""Learning parity of the host loop's two orderings: exact against overlapped (``--overlap``).

The overlapped ordering acts with the parameters from before the update dispatched in the same
env step (one update old), so that the simulator runs while the device updates. It may become
the default only if it learns as well: this script trains SAC on HalfCheetah-v5 for 100k env
steps at paper defaults, 3 seeds of each ordering, and compares the final evaluation returns
(mean and standard deviation over seeds; the rule is that the overlapped mean lies within one
standard deviation of the exact mean).

    .venv/bin/python benchmarks/overlap_parity.py [--steps 100000] [--seeds 0 1 2] [--workers 2]

Runs go to ``runs/overlap-parity/<mode>-s<seed>`` and resume if interrupted (a finished run is
not retrained). Writes ``benchmarks/results/overlap_parity.{md,json,png}``. Hours of CPU on
2 cores; not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from jaxrl.logging import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "overlap_parity")
MODES = {"exact": "--no-overlap", "overlap": "--overlap"}


def train(mode: str, seed: int, steps: int, out: str) -> dict:
    """One ``jaxrl train sac`` run (a subprocess); returns its evaluation curve and summary."""
    if not os.path.exists(os.path.join(out, "summary.json")):
        cmd = [sys.executable, "-m", "jaxrl.cli", "train", "sac", "--env", "HalfCheetah-v5"]
        cmd += ["--total-steps", str(steps), "--seed", str(seed), "--out", out, MODES[mode]]
        cmd += ["--eval-every", "10000", "--eval-episodes", "10", "--no-progress"]
        cmd += ["--no-tensorboard"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
        print(f"{mode} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    curve = [(int(r["step"]), float(r["eval_return"])) for r in rows if "eval_return" in r]
    return {
        "mode": mode,
        "seed": seed,
        "final_return": summary["final_eval_return_mean"],
        "env_steps_per_s": summary["env_steps_per_s"],
        "curve": curve,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=2, help="runs at once (one per core)")
    p.add_argument("--runs", default=os.path.join(ROOT, "runs", "overlap-parity"))
    args = p.parse_args()

    jobs = [(mode, s) for s in args.seeds for mode in MODES]
    with ThreadPoolExecutor(args.workers) as pool:
        futures = [
            pool.submit(train, m, s, args.steps, os.path.join(args.runs, f"{m}-s{s}"))
            for m, s in jobs
        ]
        runs = [f.result() for f in futures]
    res = {"steps": args.steps, "seeds": args.seeds, "runs": runs, "modes": {}}
    for mode in MODES:
        finals = np.array([r["final_return"] for r in runs if r["mode"] == mode])
        res["modes"][mode] = {"mean": float(finals.mean()), "std": float(finals.std(ddof=1))}
    exact, overlap = res["modes"]["exact"], res["modes"]["overlap"]
    res["parity"] = bool(abs(overlap["mean"] - exact["mean"]) <= exact["std"])
    write(res)


def write(res: dict) -> None:
    """``overlap_parity.{json,md,png}`` under benchmarks/results."""
    with open(RESULTS + ".json", "w") as f:
        json.dump(res, f, indent=2)
    seeds = res["seeds"]
    lines = [
        f"# Host-loop orderings: SAC on HalfCheetah-v5, {res['steps']:,} env steps",
        "",
        "Final evaluation return (10 episodes, deterministic policy) per seed; mean and sample "
        "standard deviation over seeds. Paper defaults (256x256, batch 256, 1 update per step, "
        "5,000 random steps).",
        "",
        "| ordering | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | std | env-steps/s |",
        "|---" * (len(seeds) + 4) + "|",
    ]
    for mode, stats in res["modes"].items():
        runs = {r["seed"]: r for r in res["runs"] if r["mode"] == mode}
        cells = " | ".join(f"{runs[s]['final_return']:.0f}" for s in seeds)
        rate = np.mean([runs[s]["env_steps_per_s"] for s in seeds])
        lines.append(
            f"| {mode} | {cells} | {stats['mean']:.0f} | {stats['std']:.0f} | {rate:.0f} |"
        )
    gap = res["modes"]["overlap"]["mean"] - res["modes"]["exact"]["mean"]
    verdict = "within" if res["parity"] else "outside"
    lines += [
        "",
        f"Overlapped minus exact mean: {gap:+.0f}, {verdict} one standard deviation of the "
        f"exact mode ({res['modes']['exact']['std']:.0f}).",
        "",
        "env-steps/s here is each run's average with two runs sharing the machine, so it is not a",
        "throughput figure (see throughput.md for that).",
        "",
        "Regenerate: `.venv/bin/python benchmarks/overlap_parity.py`",
        "",
    ]
    with open(RESULTS + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in res["modes"]:
        curves = [r["curve"] for r in res["runs"] if r["mode"] == mode]
        steps = [s for s, _ in curves[0]]
        values = np.array([[v for _, v in c] for c in curves])
        mean, std = values.mean(0), values.std(0, ddof=1)
        ax.plot(steps, mean, label=f"{mode} (mean of {len(curves)})")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return")
    ax.set_title("SAC HalfCheetah-v5: exact vs overlapped host loop")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS + ".png", dpi=100)


if __name__ == "__main__":
    main()
