"""Speed of the fused loop on JAX envs against brax.training, and seeds vmapped in one program.

    .venv/bin/python benchmarks/jax_envs.py            # everything (~30 min on 2 CPU cores)
    .venv/bin/python benchmarks/jax_envs.py --only ppo # one part: ppo | sac | seeds | capacity

Each comparison trains the same algorithm on the same Brax env, backend, number of envs and
per-iteration work with jaxrl (this venv) and brax.training (``.venv-brax``, created by
``benchmarks/peers/setup_brax.sh``: brax.training 0.14.2 needs jax 0.7.x), one after the other in
this run. Reported env-steps/s exclude compilation and evaluation on both sides: for jaxrl the
rate over every log interval after the first (which compiles), from ``metrics.csv``; for brax the
``env_steps_per_s_excl_eval`` of ``peers/brax_training.py`` (its epochs after the first).

Work per iteration, identical on both sides:
  PPO: 64 envs x 40 steps (8 unrolls of 5) = 2560 env steps, then 4 epochs x 8 minibatches of
       320 transitions = 32 Adam steps; policy (32,)x4, value (256,)x5, swish; obs normalization.
  SAC: one step of 64 envs, then 1 gradient step on a batch of 256; (256, 256) MLPs.

The seeds part trains SAC on jax:pendulum with 1 seed and with 8 seeds vmapped in one program
and reports wall-clock(8) / wall-clock(1), both in steady state and end to end. The capacity
part trains SAC on jax:pendulum at replay capacities 10k and 1M (1 env; 64 envs with 1 update per
iteration): the loop writes the buffer in place, so the rate should not depend on the capacity.

Writes benchmarks/results/jax_envs.{md,json}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
JAXRL = os.path.join(os.path.dirname(sys.executable), "jaxrl")
BRAX_VENV = os.environ.get("BRAX_VENV", os.path.join(ROOT, ".venv-brax"))
BRAX_PY = os.path.join(BRAX_VENV, "bin", "python")
ENV, BACKEND, NUM_ENVS = "inverted_pendulum", "mjx", 64

PPO_JAXRL = [
    "--num-envs", "64", "--batch-size", "64", "--num-minibatches", "8", "--unroll-length", "5",
    "--num-updates-per-batch", "4", "--reward-scaling", "10", "--discount", "0.97",
    "--learning-rate", "3e-4", "--entropy-cost", "0.01",
]  # fmt: skip
PPO_BRAX = [
    "--num-envs", "64", "--batch-size", "64", "--num-minibatches", "8", "--unroll-length", "5",
    "--num-updates-per-batch", "4", "--reward-scaling", "10", "--discounting", "0.97",
]  # fmt: skip
SAC_JAXRL = [
    "--num-envs", "64", "--batch-size", "256", "--updates-per-step", "1",
    "--learning-starts", "1024", "--discount", "0.97", "--hidden-dims", "256", "256",
]  # fmt: skip
SAC_BRAX = [
    "--num-envs", "64", "--batch-size", "256", "--grad-updates-per-step", "1",
    "--min-replay-size", "1024", "--discounting", "0.97",
]  # fmt: skip


def steady_rate(run_dir: str) -> tuple[float, int]:
    """Env steps/s over all log intervals but the first (compile), evaluation excluded."""
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    steps = [int(float(r["step"])) for r in rows]
    rates = [float(r["time/env_steps_per_s"]) for r in rows]
    total_steps = steps[-1] - steps[0]
    total_time = sum((steps[i] - steps[i - 1]) / rates[i] for i in range(1, len(rows)))
    return total_steps / total_time, total_steps


def run_jaxrl(agent: str, env: str, args: list[str], total: int, log_every: int) -> dict:
    """Train with the jaxrl CLI in a temporary run directory; returns rates and the summary."""
    out = tempfile.mkdtemp(prefix=f"jaxrl-{agent}-")
    cmd = [JAXRL, "train", agent, "--env", env, *args, "--total-steps", str(total)]
    cmd += ["--log-every", str(log_every), "--eval-every", str(total), "--eval-episodes", "16"]
    cmd += ["--out", out, "--no-progress", "--no-tensorboard"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    seed_dirs = sorted(d for d in os.listdir(out) if d.startswith("s") and d[1:].isdigit())
    rate, window = steady_rate(os.path.join(out, seed_dirs[0]) if seed_dirs else out)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "library": "jaxrl",
        "env_steps_per_s": rate,
        "timed_window_steps": window,
        "process_wall_s": wall,
        "final_eval_return": summary["final_eval_return_mean"],
        "total_steps": summary["total_steps"],
    }


def run_brax(algo: str, args: list[str], total: int) -> dict:
    """Train with brax.training in its own venv (peers/brax_training.py)."""
    if not os.path.exists(BRAX_PY):
        setup = os.path.join(ROOT, "benchmarks", "peers", "setup_brax.sh")
        subprocess.run(["bash", setup], check=True)
    out = tempfile.mktemp(suffix=".json")
    script = os.path.join(ROOT, "benchmarks", "peers", "brax_training.py")
    cmd = [BRAX_PY, script, "--algo", algo, "--env", ENV, "--backend", BACKEND, *args]
    cmd += ["--total-steps", str(total), "--num-eval-envs", "16", "--json-out", out]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    result["env_steps_per_s"] = result.pop("env_steps_per_s_excl_eval")
    return result


def compare(algo: str) -> dict:
    """Compare jaxrl with brax.training on inverted_pendulum / MJX / 64 envs."""
    env = f"brax:{ENV}?backend={BACKEND}"
    if algo == "ppo":
        ours = run_jaxrl("ppo", env, PPO_JAXRL, total=256_000, log_every=25_600)
        theirs = run_brax("ppo", PPO_BRAX, total=307_200)
    else:
        ours = run_jaxrl("sac", env, SAC_JAXRL, total=64_000, log_every=6_400)
        theirs = run_brax("sac", SAC_BRAX, total=100_000)
    return {
        "algo": algo,
        "env": f"{ENV} ({BACKEND})",
        "num_envs": NUM_ENVS,
        "jaxrl": ours,
        "brax": theirs,
        "speedup": ours["env_steps_per_s"] / theirs["env_steps_per_s"],
    }


def seeds(num_seeds: int = 8) -> dict:
    """SAC on jax:pendulum: one seed vs ``num_seeds`` vmapped seeds in one program."""
    args = ["--num-envs", "1", "--learning-starts", "500", "--eval-episodes", "4"]
    result = {"env": "jax:pendulum", "agent": "sac (256, 256), 1 env, 1 update/step"}
    for k in (1, num_seeds):
        r = run_jaxrl("sac", "jax:pendulum", [*args, "--num-seeds", str(k)], 2500, 500)
        result[f"seeds_{k}"] = r
    one, many = result["seeds_1"], result[f"seeds_{num_seeds}"]
    # Rates are per seed: the wall-clock of k seeds over that of one, for the same steps each.
    result["steady_wall_ratio"] = one["env_steps_per_s"] / many["env_steps_per_s"]
    result["end_to_end_wall_ratio"] = many["process_wall_s"] / one["process_wall_s"]
    result["num_seeds"] = num_seeds
    return result


CAPACITY_CASES = {
    "1 env, 1 update/step": (["--num-envs", "1", "--learning-starts", "500"], 8_000, 1_000),
    "64 envs, 1 update/iteration": (
        ["--num-envs", "64", "--updates-per-step", "1", "--learning-starts", "1024"],
        320_000,
        32_000,
    ),
}
CAPACITIES = (10_000, 1_000_000)


def capacity() -> dict:
    """SAC (256, 256) on jax:pendulum at replay capacities 10k and 1M: the rate must not move.

    A loop that copied the buffer every iteration would be O(capacity) per step (before issue
    15, 1 env ran 6x slower at 1M than at 10k). Runs alternate capacities within each case.
    """
    result = {"env": "jax:pendulum", "agent": "sac (256, 256)", "cases": {}}
    for name, (args, total, log_every) in CAPACITY_CASES.items():
        case = {}
        for cap in CAPACITIES:
            argv = [*args, "--buffer-size", str(cap)]
            case[str(cap)] = run_jaxrl("sac", "jax:pendulum", argv, total, log_every)
        lo, hi = (case[str(c)]["env_steps_per_s"] for c in CAPACITIES)
        case["ratio_1m_over_10k"] = hi / lo
        result["cases"][name] = case
    return result


def write_tables(results: dict) -> None:
    """Markdown + JSON in benchmarks/results/."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "jax_envs.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = [
        "# Fused loop on JAX envs vs brax.training",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        "no GPU. Env-steps/s exclude compilation and evaluation on both sides.",
        "",
        "| algo | env | envs | jaxrl env-steps/s | brax.training env-steps/s | jaxrl / brax |",
        "|---|---|---|---|---|---|",
    ]
    for algo in ("ppo", "sac"):
        if algo in results:
            r = results[algo]
            lines.append(
                f"| {algo.upper()} | {r['env']} | {r['num_envs']} | "
                f"{r['jaxrl']['env_steps_per_s']:,.0f} | {r['brax']['env_steps_per_s']:,.0f} | "
                f"{r['speedup']:.2f}x |"
            )
    if "seeds" in results:
        s = results["seeds"]
        k = s["num_seeds"]
        lines += [
            "",
            f"Seeds in one program ({s['agent']}, {s['env']}): wall-clock of {k} vmapped seeds "
            f"/ 1 seed = **{s['steady_wall_ratio']:.2f}** in steady state "
            f"({s['seeds_1']['env_steps_per_s']:.0f} vs {s[f'seeds_{k}']['env_steps_per_s']:.0f} "
            f"env-steps/s per seed), {s['end_to_end_wall_ratio']:.2f} end to end incl. compile.",
        ]
    if "capacity" in results:
        c = results["capacity"]
        lines += [
            "",
            f"Replay capacity ({c['agent']}, {c['env']}; env-steps/s in steady state):",
            "",
            "| setting | capacity 10k | capacity 1M | 1M / 10k |",
            "|---|---|---|---|",
        ]
        for name, case in c["cases"].items():
            small, large = (case[str(cap)]["env_steps_per_s"] for cap in CAPACITIES)
            lines.append(
                f"| {name} | {small:,.0f} | {large:,.0f} | {case['ratio_1m_over_10k']:.2f} |"
            )
    with open(os.path.join(RESULTS, "jax_envs.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run the selected parts, merging into existing results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=["ppo", "sac", "seeds", "capacity"], action="append")
    parts = p.parse_args().only or ["ppo", "sac", "seeds", "capacity"]
    path = os.path.join(RESULTS, "jax_envs.json")
    results = json.load(open(path)) if os.path.exists(path) else {}
    for part in parts:
        runs = {"seeds": seeds, "capacity": capacity}
        results[part] = runs[part]() if part in runs else compare(part)
        write_tables(results)


if __name__ == "__main__":
    main()
