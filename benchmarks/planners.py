"""Planning latency per action of the MPPI / CEM planners (jaxrl.planners).

True-simulator part: ``jaxrl plan`` (``jaxrl.loops.plan.plan_run``) on ``jax:pendulum``, the
model being copies of the simulator state, at

  - TD-MPC2's published planner defaults: 512 samples, 64 elites, 6 iterations, horizon 3
    (without TD-MPC2's terminal Q value a 3-step horizon cannot see a swing-up: expect a poor
    return; the row measures the planner's cost at those sizes), and
  - a small CPU configuration that swings the pendulum up (horizon 20, 64 samples, 8 elites,
    4 iterations; the setting of ``tests/test_planners.py``), with MPPI and CEM.

Latency is the wall time of one jitted planning call (one env, ``block_until_ready``), over every
action of ``--episodes`` 200-step episodes, compilation excluded (compiled ahead of time; its
time is reported separately). Episodes start from Pendulum's random initial states (seeded), so
returns range from about -1 (starting upright) to about -350 (hanging down).

    .venv/bin/python benchmarks/planners.py [--episodes 3] [--env jax:pendulum] [--seed 0]

Writes benchmarks/results/planners.{md,json} (the JSON merges into an existing file, so parts
added later, e.g. learned models, keep their results). Extend ``TRUE_SIM_CONFIGS`` or call
``true_sim_rows`` with other configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import jax

from jaxrl.loops.plan import PlanRunConfig, plan_run
from jaxrl.planners import PlannerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

TRUE_SIM_CONFIGS: dict[str, PlannerConfig] = {
    "TD-MPC2 defaults (MPPI)": PlannerConfig(),
    "small CPU (MPPI)": PlannerConfig(horizon=20, num_samples=64, num_elites=8, iterations=4),
    "small CPU (CEM)": PlannerConfig(
        method="cem", horizon=20, num_samples=64, num_elites=8, iterations=4
    ),
}


def true_sim_rows(
    configs: dict[str, PlannerConfig], env: str = "jax:pendulum", episodes: int = 3, seed: int = 0
) -> list[dict]:
    """One result row per planner configuration: latency per action, compile time, returns."""
    rows = []
    for name, cfg in configs.items():
        with tempfile.TemporaryDirectory() as out:
            run = PlanRunConfig(
                env=env, episodes=episodes, seed=seed, out=out, progress=False, tensorboard=False
            )
            s = plan_run(run, cfg)
        rows.append(
            {
                "config": name,
                "env": env,
                "planner": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
                "sim_steps_per_action": cfg.num_samples * cfg.iterations * cfg.horizon,
                "latency_ms_median": s["plan_latency_ms_median"],
                "latency_ms_p90": s["plan_latency_ms_p90"],
                "latency_ms_mean": s["plan_latency_ms_mean"],
                "compile_s": s["compile_s"],
                "actions": s["total_steps"],
                "episode_returns": s["episode_returns"],
                "return_mean": s["final_eval_return_mean"],
            }
        )
        print(
            f"{name}: median {s['plan_latency_ms_median']:.2f} ms, p90 "
            f"{s['plan_latency_ms_p90']:.2f} ms, returns "
            f"{[round(r, 1) for r in s['episode_returns']]}",
            flush=True,
        )
    return rows


def write_tables(results: dict) -> None:
    """Write results/planners.{json,md}."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "planners.json"), "w") as f:
        json.dump(results, f, indent=2)
    meta = results["machine"]
    lines = [
        "# Planners: latency per action",
        "",
        f"Machine: {meta['arch']}, {meta['cores']} CPU cores, no GPU; jax {meta['jax']}; 1-min "
        f"load average {meta['load_avg_1min']:.1f} at the start, "
        f"{meta.get('load_avg_1min_end', float('nan')):.1f} at the end ({meta['date']}; "
        "the cores are shared, so latencies include other processes' load).",
        "",
    ]
    if "true_simulator" in results:
        part = results["true_simulator"]
        lines += [
            "## True simulator as the model (`jaxrl plan`)",
            "",
            f"{part['env']}, {part['episodes']} episodes of 200 steps (seed {part['seed']}), one "
            "env; latency = one jitted planning call, compilation excluded.",
            "",
            "| config | method | H | samples | elites | iters | sim steps/action "
            "| median ms | p90 ms | compile s | returns |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in part["rows"]:
            p = r["planner"]
            returns = ", ".join(f"{x:.0f}" for x in r["episode_returns"])
            lines.append(
                f"| {r['config']} | {p['method']} | {p['horizon']} | {p['num_samples']} "
                f"| {p['num_elites']} | {p['iterations']} | {r['sim_steps_per_action']:,} "
                f"| {r['latency_ms_median']:.2f} | {r['latency_ms_p90']:.2f} "
                f"| {r['compile_s']:.1f} | {returns} |"
            )
        lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(RESULTS, "planners.md"), "w") as f:
        f.write(text)
    print(text)


def main() -> None:
    """Measure the true-simulator part and merge it into the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="jax:pendulum")
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    path = os.path.join(RESULTS, "planners.json")
    results = json.load(open(path)) if os.path.exists(path) else {}
    results["machine"] = {
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "load_avg_1min": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    rows = true_sim_rows(TRUE_SIM_CONFIGS, a.env, a.episodes, a.seed)
    results["machine"]["load_avg_1min_end"] = os.getloadavg()[0]
    results["true_simulator"] = {
        "env": a.env,
        "episodes": a.episodes,
        "seed": a.seed,
        "rows": rows,
    }
    write_tables(results)


if __name__ == "__main__":
    main()
