"""Resident memory against training steps over long runs: does anything grow?

Runs `jaxrl train` in a subprocess and samples its anonymous resident memory (RssAnon from
/proc, Linux; VmRSS is recorded too) every second, together with the newest step in the run's
metrics.csv. Logging, evaluations, checkpoints (with their retention) and the progress bar all
run at their usual cadence, so growth from any of them shows up. Two runs by default:

  1. SAC on HalfCheetah-v5 (host loop, paper defaults: 1M-row buffer, 256x256), 200k env steps;
  2. PPO on jax:pendulum (fused loop, 64 envs), 10M env steps.

Reported per run: RssAnon at 20%, 40%, 60%, 80% and 100% of the steps, and the growth between 20%
and 100% (the buffer and compiled programs are allocated before 20%).

Usage:
    .venv/bin/python benchmarks/memory.py [--sac-steps 200000] [--ppo-steps 20000000]

Writes benchmarks/results/memory.md and memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)


def rss_mb(pid: int, field: str = "RssAnon") -> float | None:
    """A resident-memory field of process ``pid`` in MiB, or None once it has exited.

    ``RssAnon`` (the default) is the process's own memory: heap, device buffers, Python
    objects; a leak grows it. ``VmRSS`` adds file-backed pages (the mapped XLA and MuJoCo
    libraries), which the kernel drops and reloads as other processes need memory, so it swings
    by hundreds of MiB without any leak.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def last_step(metrics: str) -> int:
    """The newest step in ``metrics.csv`` (0 before the first row)."""
    try:
        with open(metrics) as f:
            lines = f.read().strip().splitlines()
    except FileNotFoundError:
        return 0
    return int(float(lines[-1].split(",")[0])) if len(lines) > 1 else 0


def profile(name: str, argv: list[str], total: int) -> dict:
    """Run ``jaxrl train *argv`` and sample (seconds, step, RSS MiB) every second."""
    with tempfile.TemporaryDirectory() as out:
        # The progress bar runs too (to stderr, discarded): it is one of the things that may grow.
        cmd = [sys.executable, "-m", "jaxrl.cli", "train", *argv, "--out", out]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples = []
        while proc.poll() is None:
            rss, total_rss = rss_mb(proc.pid), rss_mb(proc.pid, "VmRSS")
            if rss is not None and total_rss is not None:
                step = last_step(os.path.join(out, "metrics.csv"))
                samples.append((time.perf_counter() - start, step, rss, total_rss))
            time.sleep(1.0)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: `{' '.join(cmd)}` exited with {proc.returncode}")
    return tabulate({"name": name, "argv": argv, "total_steps": total, "samples": samples})


def tabulate(run: dict) -> dict:
    """``run`` with RssAnon per tenth of the run, and the growth from 20% to 100%.

    "At X%" is the median (and the peak) of the samples taken while the newest metrics row was
    in the tenth of the run that ends at X% (from (X-10)% exclusive to X% inclusive). At 100%
    the samples after the final row are left out: they are the run's teardown (the final
    evaluation, the learning-curve plot, closing the writers), reported as ``end_mb`` (peak).
    Medians are robust to the allocator's step changes, which a single sample is not.
    """
    samples, total = run["samples"], run["total_steps"]
    median, peak = {}, {}
    for frac in FRACTIONS:
        lo, hi = (frac - 0.1) * total, frac * total
        window = [s[2] for s in samples if lo < s[1] <= hi and s[1] < total]
        median[frac] = float(np.median(window)) if window else float("nan")
        peak[frac] = float(np.max(window)) if window else float("nan")
    end = [s[2] for s in samples if s[1] >= total]
    shown = ", ".join(f"{int(f * 100)}% {median[f]:.0f} MiB" for f in FRACTIONS)
    print(f"{run['name']}: {shown}", flush=True)
    return {
        **run,
        "rss_mb_at": median,
        "peak_mb_at": peak,
        "end_mb": max(end) if end else float("nan"),
        "growth_20_100": (median[1.0] - median[0.2]) / median[0.2],
        "peak_growth_20_100": (max(peak[f] for f in FRACTIONS[1:]) - peak[0.2]) / peak[0.2],
    }


def main() -> None:
    """Profile both runs and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sac-steps", type=int, default=200_000)
    p.add_argument("--ppo-steps", type=int, default=10_000_000)
    p.add_argument(
        "--from-json", default=None, help="re-tabulate the samples of an earlier memory.json"
    )
    args = p.parse_args()
    out = os.path.join(ROOT, "benchmarks", "results", "memory")
    if args.from_json:
        with open(args.from_json) as f:
            runs = [tabulate(r) for r in json.load(f)["runs"]]
        write(runs, out)
        return
    runs = [
        profile(
            "SAC, HalfCheetah-v5, host loop",
            ["sac", "--env", "HalfCheetah-v5", "--total-steps", str(args.sac_steps),
             "--eval-every", "10000", "--log-every", "1000"],
            args.sac_steps,
        ),
        profile(
            "PPO, jax:pendulum (64 envs), fused loop",
            ["ppo", "--env", "jax:pendulum", "--total-steps", str(args.ppo_steps),
             "--eval-every", str(args.ppo_steps // 20), "--log-every", str(args.ppo_steps // 200)],
            args.ppo_steps,
        ),
    ]  # fmt: skip
    write(runs, out)


def write(runs: list[dict], out: str) -> None:
    """``out.md`` (the table) and ``out.json`` (with every sample)."""
    head = "| run | steps | " + " | ".join(f"{int(f * 100)}%: median / peak" for f in FRACTIONS)
    lines = [
        "# Resident memory over long runs",
        "",
        f"Machine: {os.cpu_count()} CPUs. Anonymous resident memory (RssAnon: heap, buffers; "
        "VmRSS also counts the mapped libraries' pages, which the kernel evicts and reloads) of "
        "the `jaxrl train` process in MiB, sampled every second; logging, evaluations, "
        "checkpoints (2 kept) and the progress bar (to a discarded stream) at their usual "
        "cadence. X% is the median / peak of the samples taken while the newest metrics row "
        "was in the tenth of the run ending at X%; at 100%, before the final row (the teardown "
        "after it: final evaluation, plot, writers closed, is the 'end' column, its peak). "
        "Growth: of the median from 20% to 100%; peak growth: the highest peak after 20% "
        "against the peak at 20%.",
        "",
        head + " | end (peak) | growth 20%-100% | peak growth |",
        "|---|---|" + "---|" * (len(FRACTIONS) + 3),
    ]
    for r in runs:
        cells = " | ".join(f"{r['rss_mb_at'][f]:.0f} / {r['peak_mb_at'][f]:.0f}" for f in FRACTIONS)
        lines.append(
            f"| {r['name']} | {r['total_steps']:,} | {cells} | {r['end_mb']:.0f} | "
            f"{100 * r['growth_20_100']:+.1f}% | {100 * r['peak_growth_20_100']:+.1f}% |"
        )
    for r in runs:
        lines.append(f"\n`jaxrl train {' '.join(r['argv'])}`")
    lines += ["", "Regenerate: `.venv/bin/python benchmarks/memory.py`", ""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(out + ".json", "w") as f:
        json.dump({"runs": runs}, f)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
