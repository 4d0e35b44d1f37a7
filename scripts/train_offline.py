"""Train an offline agent (BC, TD3+BC, CQL, IQL, ReBRAC) on a dataset: copy this file to start.

    jaxrl dataset collect --env Hopper-v5 --policy runs/sac_hopper --kind medium \
        --steps 1000000 --out data/hopper-medium.hdf5
    python scripts/train_offline.py --agent iql --dataset data/hopper-medium.hdf5
    python scripts/train_offline.py --agent cql --dataset minari:mujoco/hopper/medium-v0 \
        --total-steps 200000 --cql.lagrange

The env comes from the dataset's metadata unless --env is given (an empty --env means "from the
dataset"). Training evaluates the deterministic policy in that env every --eval-every gradient
steps and reports the D4RL normalized score. Rerunning the same command resumes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

import jaxrl
from jaxrl.offline import (
    OFFLINE_AGENTS,
    BCConfig,
    CQLConfig,
    IQLConfig,
    ReBRACConfig,
    TD3BCConfig,
)
from jaxrl.offline.setup import setup_offline


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["bc", "td3-bc", "cql", "iql", "rebrac"] = "iql"
    """Which offline agent to train."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="", total_steps=1_000_000, eval_every=10_000, log_every=5_000
    )
    """Loop options: --dataset, --env, budget (gradient steps), seed, evaluation, logging."""
    bc: BCConfig = BCConfig()
    """BC hyperparameters (used when --agent bc)."""
    td3_bc: TD3BCConfig = TD3BCConfig()
    """TD3+BC hyperparameters (used when --agent td3-bc)."""
    cql: CQLConfig = CQLConfig()
    """CQL hyperparameters (used when --agent cql)."""
    iql: IQLConfig = IQLConfig()
    """IQL hyperparameters (used when --agent iql)."""
    rebrac: ReBRACConfig = ReBRACConfig()
    """ReBRAC hyperparameters (used when --agent rebrac)."""


def main(args: Args) -> dict:
    """Load the dataset, match it to its env, then run the shared offline loop."""
    cfg = args.train
    if not cfg.dataset:
        raise SystemExit("Pass --dataset PATH (a D4RL .hdf5 file, a Minari directory, minari:ID).")
    agent_cls = OFFLINE_AGENTS[args.agent][0]
    agent_cfg = getattr(args, args.agent.replace("-", "_"))

    name = os.path.splitext(os.path.basename(os.path.normpath(cfg.dataset)))[0]
    out = cfg.out or os.path.join("runs", f"{args.agent}-{name}-s{cfg.seed}")

    # Dataset -> env (from its metadata unless --env), validated against the env's spaces;
    # the agent gets the dataset's observation/reward statistics if its config asks for them,
    # and the dataset becomes a device-resident replay buffer.
    s = setup_offline(agent_cls, agent_cfg, cfg, out)

    # Run directory: config.json first (with the dataset's reference returns); resumes.
    config = jaxrl.run_config(args.agent, s.agent_config, s.train_config)
    jaxrl.prepare_run_dir(out, {**config, "dataset_info": s.run_config_extras()})

    # The shared offline loop: lax.scan'd updates on the device, eval, logging, checkpoints.
    summary = jaxrl.train_offline(
        s.agent, s.data, s.eval_env, s.train_config, out, args.agent, s.dataset.normalized_score
    )
    if summary["completed"]:
        print(
            f"{out}: final eval return {summary['final_eval_return_mean']:.1f}, normalized "
            f"score {summary['normalized_score']}"
        )
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
