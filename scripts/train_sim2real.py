"""Train for sim-to-real, export the policy, and evaluate the exported file in a perturbed env.

    python scripts/train_sim2real.py --agent ppo --env brax:inverted_pendulum --total-steps 300000
    python scripts/train_sim2real.py --agent sac --env jax:pendulum --num-envs 4 --total-steps 12000

Training sees randomized physics at every episode (Brax envs, ``randomize=true``), sensor noise
and an action latency drawn per episode. The policy is then exported (ONNX by default) and the
exported file, not the JAX agent, drives a perturbed env: more noise and a longer latency than
in training, as a robot would be less kind than the simulator. Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Annotated, Literal

import jax
import numpy as np
import tyro

import jaxrl
from jaxrl.agents import PPOConfig, SACConfig
from jaxrl.envs.jax_envs import make_jax_env
from jaxrl.export.policy import export_run, load_policy
from jaxrl.run import train


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["sac", "ppo"] = "ppo"
    """Which agent to train."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="brax:inverted_pendulum", total_steps=300_000, num_envs=64
    )
    """Loop options (``--env`` without the sim-to-real options, which the flags below add)."""
    sac: SACConfig = SACConfig()
    """SAC hyperparameters (used when --agent sac)."""
    ppo: PPOConfig = PPOConfig()
    """PPO hyperparameters (used when --agent ppo)."""
    randomize: bool = True
    """Randomize the physics at every reset (Brax envs; Playground's Go1 ranges)."""
    obs_noise: float = 0.01
    """Training: observation noise standard deviation."""
    action_delay: str = "0:1"
    """Training: action latency in steps, fixed K or LOW:HIGH drawn per episode."""
    eval_obs_noise: float = 0.03
    """Perturbed evaluation: observation noise standard deviation."""
    eval_action_delay: str = "1:2"
    """Perturbed evaluation: action latency in steps."""
    format: Literal["onnx", "numpy", "jax"] = "onnx"
    """Export format of the policy that is evaluated."""
    episodes: int = 8
    """Perturbed evaluation episodes (run side by side)."""


def with_options(env_id: str, **options: object) -> str:
    """``env_id`` with sim-to-real options appended (``jax:pendulum?obs_noise=0.01&...``)."""
    query = "&".join(f"{k}={v}" for k, v in options.items() if v not in (None, False, 0, 0.0))
    if not query:
        return env_id
    return f"{env_id}{'&' if '?' in env_id else '?'}{query}"


def evaluate_exported(path: str, env_id: str, episodes: int, seed: int) -> np.ndarray:
    """Returns of the exported policy, one episode per env copy, in ``env_id``.

    The exported policy takes raw observations and returns actions in the env's units (the
    contract's bounds); the JAX env takes actions in [-1, 1], so they are mapped back.
    """
    policy = load_policy(path)
    env = make_jax_env(env_id, episodes)
    bounds = policy.contract["action"]
    low, high = np.asarray(bounds["low"], np.float32), np.asarray(bounds["high"], np.float32)
    step = jax.jit(env.step)
    state = env.reset(jax.random.key(seed))
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    for _ in range(env.episode_length):
        action = policy(np.asarray(state.obs))
        state = step(state, 2.0 * (action - low) / (high - low) - 1.0)
        returns += np.where(done, 0.0, np.asarray(state.reward))
        done |= np.asarray(state.terminated + state.truncation) > 0
        if done.all():
            break
    return returns


def main(args: Args) -> dict:
    """Train on the randomized env, export, evaluate the export in the perturbed env."""
    cfg, agent_cfg = args.train, {"sac": args.sac, "ppo": args.ppo}[args.agent]
    brax = cfg.env.startswith("brax:")
    train_env = with_options(
        cfg.env,
        randomize=args.randomize and brax and "true",
        obs_noise=args.obs_noise,
        action_delay=args.action_delay,
    )
    out = cfg.out or os.path.join("runs", f"sim2real-{args.agent}-{cfg.env}".replace(":", "_"))
    summary = train(args.agent, dataclasses.replace(cfg, env=train_env, out=out), agent_cfg)
    path = export_run(out, args.format)
    perturbed = with_options(
        cfg.env,
        randomize=args.randomize and brax and "true",
        obs_noise=args.eval_obs_noise,
        action_delay=args.eval_action_delay,
    )
    returns = evaluate_exported(path, perturbed, args.episodes, cfg.seed + 30_000)
    result = {
        "run": out,
        "train_env": train_env,
        "train_final_eval_return": summary["final_eval_return_mean"],
        "export": path,
        "perturbed_env": perturbed,
        "exported_return_mean": float(returns.mean()),
        "exported_return_std": float(returns.std()),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
