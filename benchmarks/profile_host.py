"""Where one env step of the host loop spends its time (issue 15's profile, host side).

Runs `jaxrl train` (SAC or TD3, paper defaults, HalfCheetah-v5, 1 env, 1 update per step) twice
under ``cProfile``, for ``--steps`` and ``--steps + --extra`` env steps, and reports the
difference per env step: compilation, warm-up and the first updates cancel, what remains is the
steady state. The host loop's parts are the methods it calls once per step:

- ``HostEnv.step``: the MuJoCo step through Gymnasium's vector env;
- ``_Host.action``: the next action, i.e. waiting for the previous call's result (the device's
  update + act) and copying it to the host;
- ``_Host.store``: writing the transition into the device buffer (a jitted ``buffer_add``);
- ``_Host.end_step``, ``Harness.advance``: episode bookkeeping, counters, the progress bar;
- ``Harness.log``/``save``: log points (metrics fetch, evaluation) and checkpoints;
- the rest of the loop body: the update call itself (argument flattening, dispatch).

``cProfile`` sees host time only; the device's work shows where the host waits for it
(``_Host.action``). Its per-call overhead inflates the many small Python calls a little, so
read the split, not the absolute rate (``benchmarks/throughput.py`` measures that).

Usage:
    .venv/bin/python benchmarks/profile_host.py [--agent sac] [--steps 2000] [--extra 2000]

Writes benchmarks/results/profile_host_AGENT.md and .json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time

from jaxrl import registry
from jaxrl.cli import train
from jaxrl.loops import TrainConfig

WAIT = "wait for the device's update + act, copy the action"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PARTS = {  # (file suffix, function name) -> part
    ("envs/gym.py", "step"): "env step (MuJoCo via Gymnasium)",
    ("loops/host.py", "action"): WAIT,
    ("loops/host.py", "store"): "transition into the device buffer",
    ("loops/host.py", "end_step"): "episode bookkeeping",
    ("loops/harness.py", "advance"): "counters, cadence, progress bar",
    ("loops/harness.py", "log"): "log points (metrics fetch, evaluation)",
    ("loops/harness.py", "save"): "checkpoints",
    ("loops/host.py", "train_host"): "total",
}


def profile(agent: str, steps: int, learning_starts: int) -> tuple[dict[str, float], float]:
    """Cumulative host seconds per part of one ``jaxrl train`` run, and its wall clock."""
    spec = registry.get(agent)
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            env="HalfCheetah-v5",
            total_steps=steps,
            seed=0,
            eval_every=10**9,
            log_every=1000,
            progress=True,
            tensorboard=False,
            out=out,
        )
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.runcall(train, agent, cfg, spec.config(learning_starts=learning_starts))
        wall = time.perf_counter() - start
    seconds = dict.fromkeys(PARTS.values(), 0.0)
    for (path, _, name), row in pstats.Stats(prof).stats.items():
        for (suffix, fn), part in PARTS.items():
            if name == fn and path.endswith(suffix):
                seconds[part] += row[3]  # cumulative time
    return seconds, wall


def main() -> None:
    """Profile two run lengths and write the per-step difference as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="sac", choices=["sac", "td3"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--extra", type=int, default=2000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    args = parser.parse_args()

    short, wall_short = profile(args.agent, args.steps, args.learning_starts)
    long, wall_long = profile(args.agent, args.steps + args.extra, args.learning_starts)
    per_step = {k: 1e3 * (long[k] - short[k]) / args.extra for k in short}
    total = per_step.pop("total")
    per_step["update call (flatten, dispatch) and the rest of the loop body"] = total - sum(
        per_step.values()
    )
    rows = sorted(per_step.items(), key=lambda kv: -kv[1])
    idle = sum(v for k, v in per_step.items() if k.startswith(("env step", "transition", "update")))
    lines = [
        f"# Host loop profile: {args.agent.upper()} on HalfCheetah-v5 (paper defaults, 1 env, "
        "1 update per step)",
        "",
        f"`benchmarks/profile_host.py --agent {args.agent} --steps {args.steps} --extra "
        f"{args.extra}`: host time per env step under cProfile, the difference of a "
        f"{args.steps + args.extra:,}- and a {args.steps:,}-step run (learning starts at "
        f"{args.learning_starts:,}). cProfile adds per-call overhead; read the split.",
        "",
        "| part | ms per env step | share |",
        "|---|---|---|",
        *[f"| {k} | {v:.2f} | {v / total:.0%} |" for k, v in rows],
        f"| **one env step** | **{total:.2f}** | 100% |",
        "",
        f"Wall clock under the profiler: {wall_short:.1f} s and {wall_long:.1f} s "
        f"({args.extra / (wall_long - wall_short):.0f} env-steps/s in between). A part near "
        "zero can come out slightly negative: it is a difference of two runs.",
        "",
        f"Host work between two waits: {total - per_step[WAIT]:.2f} ms of {total:.2f} "
        f"({(total - per_step[WAIT]) / total:.0%}). Of it, the env step, the transition write "
        f"and the update call ({idle:.2f} ms) come after the wait for step t's action and "
        "before update t is dispatched: in the exact order the device idles during them. Only "
        "the bookkeeping after the dispatch overlaps the device's work.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    name = os.path.join(RESULTS, f"profile_host_{args.agent}")
    with open(name + ".md", "w") as f:
        f.write(text)
    with open(name + ".json", "w") as f:
        json.dump({"args": vars(args), "ms_per_step": per_step, "total_ms": total}, f, indent=1)


if __name__ == "__main__":
    main()
