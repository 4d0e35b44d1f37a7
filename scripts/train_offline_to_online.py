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
    # RLPD (an off-policy agent): no offline phase; symmetric sampling from the start
    python scripts/train_offline_to_online.py --agent rlpd --dataset data/hopper-medium.hdf5 \
        --online-steps 50000

Any offline agent (pretrained, then fine-tuned) or off-policy agent (online only) of the
registry. After ``--agent NAME`` come the loop options and NAME's hyperparameters, as for
``jaxrl train NAME``; ``--agent NAME --help`` lists them.

One run directory holds both phases: metrics.csv rows are numbered by gradient steps offline,
then by offline steps + env steps online (with an env_step column). Rerunning the same command
resumes whichever phase was interrupted. `jaxrl train AGENT ... --online-steps M` does the same.
"""

from __future__ import annotations

import argparse
import dataclasses

from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.loops import TrainConfig, default_out
from jaxrl.run.finetune import pretrain, start_run, train_online

# This script's loop defaults; every one can be overridden on the command line.
DEFAULTS = TrainConfig(
    env="", offline_steps=100_000, online_steps=50_000, eval_every=5_000, log_every=1_000
)


def main(argv: list[str] | None = None) -> dict:
    """Dataset and env setup, the offline phase, then the online phase."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--agent", default="iql", choices=registry.names("offline", "off-policy"))
    args, rest = p.parse_known_args(argv)
    spec = registry.get(args.agent)
    cfg, agent_cfg = parse_train_args(spec.name, rest, DEFAULTS)
    if not cfg.dataset:
        raise SystemExit("Pass --dataset PATH (a D4RL .hdf5 file, a Minari directory, minari:ID).")
    if not spec.offline:
        cfg = dataclasses.replace(cfg, offline_steps=0)  # an online agent has no offline phase
    out = cfg.out or default_out(spec.name, cfg)

    # Dataset -> env (from its metadata unless --env), validated against the env's spaces; the
    # agent is created with the dataset's statistics and config.json is written (or checked).
    s = start_run(spec, agent_cfg, cfg, out)

    # Offline phase: the shared offline loop (lax.scan'd updates on the dataset). Returns the
    # agent of its last checkpoint: networks, optimizer states and data statistics.
    agent, offline_steps = pretrain(s, out)
    if agent is None:
        print("Stopped during the offline phase; rerun the same command to resume.")
        return {"completed": False}

    # Online phase: the shared host loop. Each minibatch draws --offline-ratio of its rows from
    # the dataset and the rest from the online replay buffer.
    summary = train_online(s, agent, out, offline_steps)
    if summary["completed"]:
        print(
            f"{out}: final eval return {summary['final_eval_return_mean']:.1f} after "
            f"{offline_steps} offline and {summary['online_steps']} online steps, normalized "
            f"score {summary['normalized_score']}"
        )
    return summary


if __name__ == "__main__":
    main()
