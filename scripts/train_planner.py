"""Train a world-model planner (TD-MPC2 or PETS), or plan with the true simulator: copy and edit.

    python scripts/train_planner.py --agent tdmpc2 --env Pendulum-v1 --total-steps 10000
    python scripts/train_planner.py --agent pets --env jax:pendulum --total-steps 3000 \
        --pets.reward-fn pendulum
    python scripts/train_planner.py --agent true-model --env jax:pendulum --episodes 2

A planner acts by searching action sequences with a model at every step: TD-MPC2 plans in a
learned latent space with MPPI, PETS with CEM over particles of a learned ensemble, and
``true-model`` runs MPPI on copies of the JAX simulator itself (no training). Gymnasium ids train
in the host loop, ``jax:``/``brax:`` ids in the fused loop (one XLA program per chunk). Each run
writes jaxrl's run-directory layout; rerunning a training command resumes it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

import jaxrl
from jaxrl import registry
from jaxrl.agents import PETSConfig, TDMPC2Config
from jaxrl.loops.plan import PlanRunConfig, plan_run
from jaxrl.planners import PlannerConfig
from jaxrl.run.runs import make_jax_envs


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["tdmpc2", "pets", "true-model"] = "tdmpc2"
    """Which planner: a learned model (tdmpc2, pets) or the true JAX simulator (true-model)."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="Pendulum-v1", total_steps=10_000
    )
    """Loop options: env, budget, seed, evaluation, logging."""
    tdmpc2: TDMPC2Config = TDMPC2Config()
    """TD-MPC2 hyperparameters (used when --agent tdmpc2)."""
    pets: PETSConfig = PETSConfig()
    """PETS hyperparameters (used when --agent pets)."""
    planner: PlannerConfig = PlannerConfig()
    """MPPI settings of --agent true-model."""
    episodes: int = 1
    """Episodes to plan with --agent true-model."""


def main(args: Args) -> dict:
    """Plan with the simulator, or build envs and agent and hand them to the shared loop."""
    cfg = args.train
    out = cfg.out or os.path.join("runs", f"{args.agent}-{cfg.env}-s{cfg.seed}".replace(":", "_"))
    if args.agent == "true-model":  # no learning: the simulator is the model
        run = PlanRunConfig(env=cfg.env, episodes=args.episodes, seed=cfg.seed, out=out)
        return plan_run(run, args.planner)

    spec = registry.get(args.agent)  # kind "planner": the loops carry the plan between steps
    agent_cfg = {"tdmpc2": args.tdmpc2, "pets": args.pets}[args.agent]
    # Settings the agent derives from the env (TD-MPC2's discount from the episode length),
    # and its refusals (TD-MPC2 without --tdmpc2.episodic on an env that can terminate).
    agent_cfg = spec.for_env(agent_cfg, cfg.env)
    jaxrl.prepare_run_dir(out, jaxrl.run_config(args.agent, agent_cfg, cfg))

    if jaxrl.envs.is_jax_env(cfg.env):  # one XLA program per chunk: plan, step, store, learn
        n = cfg.num_envs or 1  # planners plan for every env at every step: one by default
        env, eval_env = make_jax_envs(cfg.env, n, cfg.eval_episodes, agent_cfg, spec)
        return jaxrl.train_fused(spec, agent_cfg, env, eval_env, cfg, [out])[0]

    env = jaxrl.make_env(cfg.env, cfg.num_envs or 1)
    eval_env = jaxrl.make_env(cfg.env, cfg.eval_episodes)
    agent = spec.agent.create(agent_cfg, env.obs_example, env.action_example, cfg.seed)
    summary = jaxrl.train_host(spec, agent, env, eval_env, cfg, out)
    env.close()
    eval_env.close()
    if summary["completed"]:
        print(f"{out}: final eval return {summary['final_eval_return_mean']:.1f}")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
