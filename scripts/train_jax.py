"""Train SAC, TD3 or PPO on a JAX env (Brax / MJX or pure JAX) in the fused loop.

    python scripts/train_jax.py --agent ppo --env brax:inverted_pendulum --total-steps 200000
    python scripts/train_jax.py --agent sac --env jax:pendulum --num-envs 4 --num-seeds 4

Acting, simulating, storing and learning run as one XLA program per chunk of steps, vmapped over
seeds. Each seed writes a run directory with jaxrl's run-directory layout; rerunning resumes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

import jaxrl
from jaxrl import registry
from jaxrl.agents import PPOConfig, SACConfig, TD3Config
from jaxrl.run.runs import make_jax_envs


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["sac", "td3", "ppo"] = "ppo"
    """Which agent to train."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="jax:pendulum", total_steps=200_000, num_envs=64
    )
    """Loop options: env, budget, seeds, evaluation, logging."""
    sac: SACConfig = SACConfig()
    """SAC hyperparameters (used when --agent sac)."""
    td3: TD3Config = TD3Config()
    """TD3 hyperparameters (used when --agent td3)."""
    ppo: PPOConfig = PPOConfig()
    """PPO hyperparameters (used when --agent ppo)."""


def main(args: Args) -> list[dict]:
    """Build the vectorized envs, then hand the agent's registry entry to the fused loop."""
    cfg = args.train
    spec = registry.get(args.agent)  # kind (on- or off-policy), agent class, what it needs
    agent_cfg = {"sac": args.sac, "td3": args.td3, "ppo": args.ppo}[args.agent]

    # Training envs normalize observations when the agent asks for it (PPO does); the eval envs
    # then use the training statistics, frozen.
    env, eval_env = make_jax_envs(cfg.env, cfg.num_envs or 64, cfg.eval_episodes, agent_cfg, spec)
    # With privileged=true in the env id the actor reads only what a robot's policy would see.
    agent_cfg = spec.with_actor_observation(agent_cfg, env)

    # One run directory per seed: seed, seed+1, ... train together under jax.vmap.
    out = cfg.out or os.path.join("runs", f"{args.agent}-{cfg.env}".replace(":", "_"))
    outs = []
    for i in range(cfg.num_seeds):
        seed_cfg = dataclasses.replace(cfg, seed=cfg.seed + i, num_seeds=1)
        outs.append(out if cfg.num_seeds == 1 else os.path.join(out, f"s{cfg.seed + i}"))
        jaxrl.prepare_run_dir(outs[-1], jaxrl.run_config(args.agent, agent_cfg, seed_cfg))

    summaries = jaxrl.train_fused(spec, agent_cfg, env, eval_env, cfg, outs)
    for o, s in zip(outs, summaries, strict=True):
        if s["completed"]:
            print(f"{o}: final eval return {s['final_eval_return_mean']:.1f}")
    return summaries


if __name__ == "__main__":
    main(tyro.cli(Args))
