"""Train an online agent (SAC or TD3) on a Gymnasium env: copy this file to start an experiment.

    python scripts/train_online.py --agent sac --env HalfCheetah-v5 --total-steps 100000
    python scripts/train_online.py --agent td3 --env Pendulum-v1 --total-steps 10000 \
        --td3.learning-starts 1000 --td3.hidden-dims 128 128

Everything below uses only jaxrl's public API; the run directory has the documented layout
(config.json, metrics.csv, summary.json, checkpoints/, TensorBoard events, learning_curve.png)
and rerunning the same command resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

import jaxrl
from jaxrl import registry
from jaxrl.agents import SACConfig, TD3Config


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["sac", "td3"] = "sac"
    """Which agent to train."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="Pendulum-v1", total_steps=20_000
    )
    """Loop options: env, budget, seed, evaluation, logging."""
    sac: SACConfig = SACConfig()
    """SAC hyperparameters (used when --agent sac)."""
    td3: TD3Config = TD3Config()
    """TD3 hyperparameters (used when --agent td3)."""


def main(args: Args) -> dict:
    """Build envs and agent, then hand them to the shared training loop."""
    spec = registry.get(args.agent)  # the agent's class, and what the loop must supply to it
    agent_cfg = {"sac": args.sac, "td3": args.td3}[args.agent]
    cfg = args.train

    # Environments: `num_envs` training copies and one eval copy per evaluation episode.
    env = jaxrl.make_env(cfg.env, cfg.num_envs or 1)
    eval_env = jaxrl.make_env(cfg.env, cfg.eval_episodes)

    # The agent is a pytree; create() only needs example (unbatched) observation and action.
    agent = spec.agent.create(agent_cfg, env.obs_example, env.action_example, cfg.seed)

    # Run directory: config.json is written first; an existing checkpoint is resumed.
    out = cfg.out or os.path.join("runs", f"{args.agent}-{cfg.env}-s{cfg.seed}")
    jaxrl.prepare_run_dir(out, jaxrl.run_config(args.agent, agent_cfg, cfg))

    # The shared host loop: random warm-up, fused updates, evaluation, logging, checkpoints.
    summary = jaxrl.train_host(spec, agent, env, eval_env, cfg, out)
    env.close()
    eval_env.close()
    if summary["completed"]:
        print(f"{out}: final eval return {summary['final_eval_return_mean']:.1f}")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
