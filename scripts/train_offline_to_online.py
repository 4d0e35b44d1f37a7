"""Pretrain on a dataset, then keep training online: copy this file to start.

    jaxrl dataset collect --env Hopper-v5 --policy runs/sac_hopper --kind medium \
        --steps 100000 --out data/hopper-medium.hdf5
    # IQL: 100k offline gradient steps, then 50k env steps online with half of every
    # minibatch from the dataset
    python scripts/train_offline_to_online.py --agent iql --dataset data/hopper-medium.hdf5 \
        --offline-steps 100000 --online-steps 50000
    # Cal-QL, dropping the dataset from the mix at the switch
    python scripts/train_offline_to_online.py --agent cal-ql --dataset data/hopper-medium.hdf5 \
        --offline-steps 100000 --online-steps 50000 --offline-ratio 0
    # RLPD: no offline phase; SAC with symmetric sampling from the start
    python scripts/train_offline_to_online.py --agent rlpd --dataset data/hopper-medium.hdf5 \
        --online-steps 50000

One run directory holds both phases: metrics.csv rows are numbered by gradient steps offline,
then by offline steps + env steps online (with an env_step column). Rerunning the same command
resumes whichever phase was interrupted. `jaxrl train AGENT ... --online-steps M` does the same.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import tyro

import jaxrl
from jaxrl.agents import RLPDConfig
from jaxrl.agents.sac import SAC
from jaxrl.offline import (
    OFFLINE_AGENTS,
    CalQLConfig,
    CQLConfig,
    FQLConfig,
    IQLConfig,
    ReBRACConfig,
    TD3BCConfig,
)
from jaxrl.offline.finetune import pretrain, start_run, train_online


@dataclasses.dataclass(frozen=True)
class Args:
    """Command-line flags of this script."""

    agent: Literal["iql", "cql", "cal-ql", "td3-bc", "rebrac", "fql", "rlpd"] = "iql"
    """Which agent: an offline agent (pretrained, then fine-tuned) or rlpd (online only)."""
    train: Annotated[jaxrl.TrainConfig, tyro.conf.OmitArgPrefixes] = jaxrl.TrainConfig(
        env="", offline_steps=100_000, online_steps=50_000, eval_every=5_000, log_every=1_000
    )
    """Loop options: --dataset, --env, --offline-steps, --online-steps, --offline-ratio, ..."""
    iql: IQLConfig = IQLConfig(actor_lr_schedule="constant")
    """IQL hyperparameters (used when --agent iql); constant actor lr, as for fine-tuning."""
    cql: CQLConfig = CQLConfig()
    """CQL hyperparameters (used when --agent cql)."""
    cal_ql: CalQLConfig = CalQLConfig()
    """Cal-QL hyperparameters (used when --agent cal-ql)."""
    td3_bc: TD3BCConfig = TD3BCConfig()
    """TD3+BC hyperparameters (used when --agent td3-bc)."""
    rebrac: ReBRACConfig = ReBRACConfig()
    """ReBRAC hyperparameters (used when --agent rebrac)."""
    fql: FQLConfig = FQLConfig()
    """FQL hyperparameters (used when --agent fql)."""
    rlpd: RLPDConfig = RLPDConfig()
    """RLPD hyperparameters (used when --agent rlpd)."""


def main(args: Args) -> dict:
    """Dataset and env setup, the offline phase, then the online phase."""
    cfg = args.train
    if not cfg.dataset:
        raise SystemExit("Pass --dataset PATH (a D4RL .hdf5 file, a Minari directory, minari:ID).")
    agent_cls = SAC if args.agent == "rlpd" else OFFLINE_AGENTS[args.agent][0]
    agent_cfg = getattr(args, args.agent.replace("-", "_"))
    if args.agent == "rlpd":
        cfg = dataclasses.replace(cfg, offline_steps=0)  # RLPD has no offline phase
    out = cfg.out or jaxrl.training.default_out(args.agent, cfg)

    # Dataset -> env (from its metadata unless --env), validated against the env's spaces; the
    # agent is created with the dataset's statistics and config.json is written (or checked).
    s = start_run(args.agent, agent_cls, agent_cfg, cfg, out)

    # Offline phase: the shared offline loop (lax.scan'd updates on the dataset). Returns the
    # agent of its last checkpoint: networks, optimizer states and data statistics.
    agent, offline_steps = pretrain(s, out, args.agent)
    if agent is None:
        print("Stopped during the offline phase; rerun the same command to resume.")
        return {"completed": False}

    # Online phase: the shared host loop. Each minibatch draws --offline-ratio of its rows from
    # the dataset and the rest from the online replay buffer.
    summary = train_online(s, agent, out, args.agent, offline_steps)
    if summary["completed"]:
        print(
            f"{out}: final eval return {summary['final_eval_return_mean']:.1f} after "
            f"{offline_steps} offline and {summary['online_steps']} online steps, normalized "
            f"score {summary['normalized_score']}"
        )
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
