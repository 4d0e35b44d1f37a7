"""H2O on a sim-to-real pendulum: real data and the simulator, against either alone.

The paper's setup (Niu et al., 2022: the real system is the standard task with a dataset, the
simulator the task with other physics): the "real" system is ``jax:pendulum`` (``--real``) and the
simulator a pendulum under half its gravity (``--sim``, ``jax:pendulum?g=5``), where the torque
almost lifts the pole straight up, so a policy learned there skips the swings the real pendulum
needs. The real dataset (``--data-policy``) is a rollout (``jaxrl.run.collect.rollout_jax``) on the
real env of a uniformly random policy (default, as the learning test) or of the SAC expert of the
test suite (``tests.offline_utils.pendulum_policies``). Three agents, ``--seeds`` seeds each,
every one evaluated with its deterministic policy on the real env
(``jaxrl.run.commands.evaluate_run``):

* **h2o**: ``jaxrl train h2o --dataset real.hdf5 --env SIM`` (real rows and simulator
  rollouts, half and half in every minibatch);
* **h2o-sim**: the same agent without ``--dataset`` (simulator only);
* **iql**: ``jaxrl train iql --dataset real.hdf5`` (the real data only, offline).

Usage:
    .venv/bin/python benchmarks/h2o_sim2real.py [--real jax:pendulum] [--sim 'jax:pendulum?g=5']
        [--data-policy random|expert] [--steps 10000] [--seeds 3] [--episodes 50] [--out DIR]

Writes benchmarks/results/h2o_sim2real.{md,json} (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def real_dataset(real: str, policy: str, steps: int, seed: int, path: str) -> float:
    """Roll ``policy`` (random or expert) out on ``real`` into ``path``; the data's mean return."""
    from jaxrl.data import save_d4rl
    from jaxrl.run.collect import rollout_jax
    from jaxrl.run.runs import load_run

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from offline_utils import pendulum_policies  # the test suite's SAC expert

    agent = None if policy == "random" else load_run(pendulum_policies()["expert"]).agent
    data = rollout_jax(real, agent, steps, seed)
    save_d4rl(data, path)
    return float(data.episode_returns().mean())


def run_arm(arm: str, seed: int, data: str, args: argparse.Namespace, root: str) -> float:
    """Train one agent of ``arm`` and return its mean return on the real env."""
    from jaxrl import registry
    from jaxrl.loops import TrainConfig
    from jaxrl.run import train
    from jaxrl.run.commands import evaluate_run

    out = os.path.join(root, f"{arm}-s{seed}")
    common = {"seed": seed, "eval_episodes": 5, "progress": False, "tensorboard": False}
    if arm == "iql":
        cfg = TrainConfig(env=args.real, dataset=data, total_steps=args.steps, out=out, **common)
        agent_cfg = registry.get("iql").config(max_steps=args.steps)
    else:
        cfg = TrainConfig(
            env=args.sim,
            dataset=data if arm == "h2o" else None,
            total_steps=args.steps,
            num_envs=1,
            out=out,
            eval_every=args.steps,
            **common,
        )
        agent_cfg = registry.get("h2o").config(learning_starts=args.learning_starts)
    train("iql" if arm == "iql" else "h2o", cfg, agent_cfg)
    return evaluate_run(out, args.episodes, env=args.real)["return_mean"]


def write(results: dict, args: argparse.Namespace) -> None:
    """The JSON record and the markdown table."""
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "h2o_sim2real.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        "# H2O on a sim-to-real pendulum",
        "",
        f"`benchmarks/h2o_sim2real.py`: real env `{args.real}`, simulator `{args.sim}`; "
        f"the real dataset: {results['data_steps']} steps of the {args.data_policy} policy on the "
        f"real env (mean episode return {results['data_return']:.1f}). {args.steps} env steps "
        f"(H2O, one env, one update per step, warm-up {args.learning_starts}) or gradient steps "
        f"(IQL), default configs; every policy evaluated on the real env "
        f"({args.episodes} episodes). The test suite's SAC expert (trained on `jax:pendulum`) "
        f"on the real env: {results['expert_on_real']:.1f}; on the simulator: "
        f"{results['expert_on_sim']:.1f}.",
        "",
        "| agent | data | " + " | ".join(f"seed {s}" for s in results["seeds"]) + " | mean ± std |",
        "|---|---|" + "---|" * (len(results["seeds"]) + 1),
    ]
    what = {"h2o": "real + simulator", "h2o-sim": "simulator only", "iql": "real data only"}
    for arm, returns in results["returns"].items():
        # Seeds not run yet (a partial table, written after every seed) show as "-".
        pending = ["-"] * (len(results["seeds"]) - len(returns))
        cells = " | ".join([f"{r:.1f}" for r in returns] + pending)
        lines.append(
            f"| {arm} | {what[arm]} | {cells} | {np.mean(returns):.1f} ± {np.std(returns):.1f} |"
        )
    lines += ["", f"Wall clock {results['wall_s']:.0f} s on {results['machine']}.", ""]
    with open(os.path.join(args.out, "h2o_sim2real.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default="jax:pendulum", help="the real env's id")
    parser.add_argument("--sim", default="jax:pendulum?g=5", help="the simulator's env id")
    parser.add_argument("--data-policy", choices=("random", "expert"), default="random")
    parser.add_argument("--steps", type=int, default=10_000, help="env or gradient steps")
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--data-steps", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)

    from jaxrl.run.commands import evaluate_run

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from offline_utils import pendulum_policies  # the test suite's SAC expert

    start = time.perf_counter()
    root = tempfile.mkdtemp(prefix="h2o_sim2real-")
    data = os.path.join(root, "real.hdf5")
    expert = pendulum_policies()["expert"]
    results = {
        "real": args.real,
        "steps": args.steps,
        "seeds": list(range(args.seeds)),
        "data_steps": args.data_steps,
        "data_return": real_dataset(args.real, args.data_policy, args.data_steps, 0, data),
        "expert_on_real": evaluate_run(expert, args.episodes, env=args.real)["return_mean"],
        "expert_on_sim": evaluate_run(expert, args.episodes, env=args.sim)["return_mean"],
        "returns": {arm: [] for arm in ("h2o", "h2o-sim", "iql")},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    for seed in results["seeds"]:
        for arm in results["returns"]:
            results["returns"][arm].append(run_arm(arm, seed, data, args, root))
            print(arm, seed, f"{results['returns'][arm][-1]:.1f}", flush=True)
        results["wall_s"] = time.perf_counter() - start
        write(results, args)
    print(f"wrote {args.out}/h2o_sim2real.md")


if __name__ == "__main__":
    main()
