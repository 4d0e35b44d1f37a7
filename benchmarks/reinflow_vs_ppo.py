"""ReinFlow (BC on medium data, then PPO) against PPO from scratch on jax:pendulum.

Both train in the fused loop for the same online env-step budget and seeds; ReinFlow first
clones the generated Pendulum-v1 medium data (``tests/offline_utils.py``, its actions halved
into jax:pendulum's [-1, 1]) for ``--bc-steps`` gradient steps in the offline loop. The table
gives the evaluation return (50 episodes, deterministic policy) at online env steps 0 (ReinFlow:
the cloned policy), E, 2E, ... and the wall clock.

Usage:
    nice -n 19 .venv/bin/python benchmarks/reinflow_vs_ppo.py [--seeds 0 1 2]
        [--online-steps 60000] [--bc-steps 3000] [--results-dir benchmarks/results]

Writes RESULTS/reinflow_vs_ppo.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.agents import PPOConfig, ReinFlowConfig
from jaxrl.loops import (
    OfflineState,
    TrainConfig,
    prepare_run_dir,
    run_config,
    strongly_typed,
    train_fused,
    train_offline,
)
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics
from jaxrl.run.runs import make_jax_envs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NUM_ENVS = 16
REINFLOW = ReinFlowConfig(  # the learning test's CPU-size settings
    velocity_hidden_dims=(128, 128), critic_hidden_dims=(128, 128), actor_lr=3e-4,
    reward_scaling=0.1, critic_warmup_updates=5, unroll_length=10, minibatch_segments=16,
    num_minibatches=4,
)  # fmt: skip
PPO = PPOConfig(unroll_length=20, batch_size=16, num_minibatches=16)  # jaxrl's pendulum test


def _curve(out: str, offset: int = 0) -> dict[int, float]:
    """Evaluations by online env step; rows after an offline phase are numbered offset + step."""
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    evals = [r for r in rows if "eval_return" in r and r["step"] > offset]
    return {int(r["step"]) - offset: r["eval_return"] for r in evals}


def run_reinflow(seed: int, bc_steps: int, online: int, evals: int, out: str) -> dict:
    spec = registry.get("reinflow")
    config = dataclasses.replace(REINFLOW, bc_decay_steps=bc_steps)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from offline_utils import pendulum_dataset  # the generated test data

    medium = pendulum_dataset("medium")
    data = dataclasses.replace(medium, actions=medium.actions / 2.0, env_id="jax:pendulum")
    env, eval_env = make_jax_envs("jax:pendulum", NUM_ENVS, 50, config, spec)
    cfg = TrainConfig(
        env="jax:pendulum", total_steps=bc_steps, seed=seed, num_envs=NUM_ENVS,
        eval_every=bc_steps, log_every=bc_steps, eval_episodes=50, progress=False,
        tensorboard=False, out=out,
    )  # fmt: skip
    prepare_run_dir(out, run_config("reinflow", config, cfg))
    start = time.perf_counter()
    agent = spec.agent.create(config, jnp.zeros(3), jnp.zeros(1), seed)
    bc = train_offline(spec, agent, data.buffer(-1.0, 1.0), eval_env, cfg, out)
    template = strongly_typed(OfflineState(agent, jax.random.key(0)))
    agent = Checkpointer(os.path.join(out, "checkpoints")).restore(template, bc_steps)[0].agent
    agents = strongly_typed(jax.tree.map(lambda x: jnp.asarray(x)[None], agent))
    every = online // evals
    online_cfg = dataclasses.replace(cfg, total_steps=online, eval_every=every, log_every=every)
    train_fused(spec, config, env, eval_env, online_cfg, [out], agents=agents, step_offset=bc_steps)
    curve = {0: bc["final_eval_return_mean"], **_curve(out, bc_steps)}
    return {"curve": curve, "wall_s": time.perf_counter() - start}


def run_ppo(seed: int, online: int, evals: int, out: str) -> dict:
    spec = registry.get("ppo")
    env, eval_env = make_jax_envs("jax:pendulum", NUM_ENVS, 50, PPO, spec)
    every = online // evals
    cfg = TrainConfig(
        env="jax:pendulum", total_steps=online, seed=seed, num_envs=NUM_ENVS, eval_every=every,
        log_every=every, eval_episodes=50, progress=False, tensorboard=False, out=out,
    )  # fmt: skip
    prepare_run_dir(out, run_config("ppo", PPO, cfg))
    start = time.perf_counter()
    train_fused(spec, PPO, env, eval_env, cfg, [out])
    return {"curve": _curve(out), "wall_s": time.perf_counter() - start}


def _at(curve: dict, step: int) -> float:
    """The evaluation at the first logged step at or after ``step`` (rollouts overshoot)."""
    keys = sorted(int(k) for k in curve)
    near = next((k for k in keys if k >= step), keys[-1])
    return curve[near] if near in curve else curve[str(near)]


def write(results: dict, args: argparse.Namespace) -> None:
    marks = [i * args.online_steps // args.evals for i in range(args.evals + 1)]
    lines = [
        "# ReinFlow vs PPO on jax:pendulum",
        "",
        f"`benchmarks/reinflow_vs_ppo.py`: ReinFlow clones the generated Pendulum-v1 medium data "
        f"({args.bc_steps} BC steps), then PPO fine-tunes it; PPO starts from scratch. Same "
        f"online env steps, {NUM_ENVS} envs, agent seeds {args.seeds} (the data of "
        "`JAXRL_TEST_SEED`, default 0). Evaluation return (50 "
        "episodes, deterministic policy) at online env steps; step 0 of ReinFlow is the cloned "
        "policy. Each cell is the mean over seeds, the seeds' values in brackets.",
        "",
        "| method | " + " | ".join(f"{m // 1000}k" for m in marks) + " | wall s / seed |",
        "|---|" + "---|" * (len(marks) + 1),
    ]
    for name, runs in results.items():
        cells = []
        for m in marks:
            if m == 0 and name == "ppo":
                cells.append("-")
                continue
            vals = [_at(r["curve"], m) for r in runs]
            cells.append(f"{np.mean(vals):.0f} [{', '.join(f'{v:.0f}' for v in vals)}]")
        wall = np.mean([r["wall_s"] for r in runs])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {wall:.0f} |")
    lines += [
        "",
        "ReinFlow's settings are the learning test's CPU-size ones (2x128 networks, 640-step "
        "rollouts, actor rate 3e-4, rewards / 10, 5 critic-only updates); PPO's are jaxrl's "
        "pendulum test settings (`--unroll-length 20 --batch-size 16`, 16 minibatches). The "
        "machine was shared with other jobs, so wall clocks are only indicative.",
        "",
    ]
    os.makedirs(args.results_dir, exist_ok=True)
    base = os.path.join(args.results_dir, "reinflow_vs_ppo")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(base + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--online-steps", type=int, default=60_000)
    parser.add_argument("--bc-steps", type=int, default=3000)
    parser.add_argument("--evals", type=int, default=4)
    parser.add_argument("--results-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    results: dict[str, list] = {"reinflow": [], "ppo": []}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "reinflow")
            results["reinflow"].append(
                run_reinflow(seed, args.bc_steps, args.online_steps, args.evals, out)
            )
            results["ppo"].append(run_ppo(seed, args.online_steps, args.evals, tmp + "/ppo"))
        print(f"seed {seed}: done", flush=True)
        write(results, args)
    print(f"wrote {os.path.join(args.results_dir, 'reinflow_vs_ppo')}.md and .json")


if __name__ == "__main__":
    main()
