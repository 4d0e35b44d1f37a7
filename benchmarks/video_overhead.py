"""Does ``--video-every`` slow training down between its video points?

Trains the same run twice, without and with ``--video-every``, on a Gymnasium env (host loop)
and a JAX env (fused loop), and compares ``time/env_steps_per_s`` of the log intervals. The
rate of an interval is measured between two log points and excludes the evaluation (and the
video) at its start, so the intervals that render no video should run at the same speed.
Alternating repeats, medians of the per-interval rates. Writes
``benchmarks/results/video_overhead.{md,json}``.

    .venv/bin/python benchmarks/video_overhead.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile

import numpy as np

from jaxrl.agents.sac import SACConfig
from jaxrl.loops import TrainConfig
from jaxrl.loops.logging import read_metrics
from jaxrl.run.train import train

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

CASES = {
    "host loop, Pendulum-v1": dict(env="Pendulum-v1", total_steps=3000, eval_every=500,
                                   log_every=250, eval_episodes=2),
    "fused loop, jax:pendulum": dict(env="jax:pendulum", total_steps=12_000, num_envs=8,
                                     eval_every=2000, log_every=500, eval_episodes=2),
}  # fmt: skip
VIDEO_EVERY = 2


def _rates(case: dict, video: bool, out: str) -> tuple[list[float], list[int]]:
    """Per-interval env steps/s of one run, and the steps of its rows."""
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(**case, out=out, progress=False, video_every=VIDEO_EVERY if video else None)
    train("sac", cfg, SACConfig(learning_starts=250))
    rows = [
        r for r in read_metrics(os.path.join(out, "metrics.csv")) if "time/env_steps_per_s" in r
    ]
    return [r["time/env_steps_per_s"] for r in rows], [int(r["step"]) for r in rows]


def main() -> None:
    """Run the cases and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    table = {}
    tmp = tempfile.mkdtemp(prefix="video-overhead-")
    try:
        for name, case in CASES.items():
            runs: dict[str, list] = {"without": [], "with": []}
            for _ in range(args.repeats):
                for label in ("without", "with"):
                    runs[label].append(_rates(case, label == "with", f"{tmp}/{label}"))
            steps = runs["with"][0][1]
            eval_every = case["eval_every"]
            # An interval starts after the previous row; it follows a video point when that row
            # was a filmed evaluation (the rate excludes that video, which is what we check).
            quiet = list(range(1, len(steps)))  # the first interval includes compilation
            filmed = {
                s for s in steps if s % eval_every == 0 and (s // eval_every) % VIDEO_EVERY == 0
            }
            after_video = [i for i in quiet if steps[i - 1] in filmed]
            med = {
                k: np.median([[r[0][i] for i in quiet] for r in v], axis=0) for k, v in runs.items()
            }
            after = [med["with"][quiet.index(i)] for i in after_video]
            table[name] = {
                "without": float(np.median(med["without"])),
                "with": float(np.median(med["with"])),
                "after_video_with": float(np.median(after)) if after else None,
                "intervals": len(quiet),
                "intervals_after_video": len(after_video),
                "steps": steps,
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        "# Rollout videos: training speed with and without `--video-every`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}). Same run twice, alternating, "
        f"{args.repeats} repeats; `--video-every {VIDEO_EVERY}`; SAC (learning starts at 250). "
        "Env steps/s per log interval (the harness's `time/env_steps_per_s`, which excludes the "
        "evaluation at the interval's start), median over intervals after the first "
        "(compilation) and over repeats.",
        "",
        "| case | intervals | without videos | with videos | ratio | intervals right after a "
        "video, with videos |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in table.items():
        after = f"{r['after_video_with']:.0f}" if r["after_video_with"] is not None else "-"
        lines.append(
            f"| {name} | {r['intervals']} | {r['without']:.0f} | {r['with']:.0f} | "
            f"{r['with'] / r['without']:.2f} | {after} ({r['intervals_after_video']}) |"
        )
    lines += ["", "Regenerate: `.venv/bin/python benchmarks/video_overhead.py`", ""]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "video_overhead.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(RESULTS, "video_overhead.json"), "w") as f:
        json.dump(table, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
