"""Train an offline agent on a dataset: copy this file to start.

    jaxrl dataset collect --env Hopper-v5 --policy runs/sac_hopper --kind medium \
        --steps 1000000 --out data/hopper-medium.hdf5
    python scripts/train_offline.py --agent iql --dataset data/hopper-medium.hdf5
    python scripts/train_offline.py --agent cql --dataset minari:mujoco/hopper/medium-v0 \
        --total-steps 200000 --lagrange

Every offline agent of the registry works (bc, td3-bc, cql, cal-ql, iql, rebrac, idql,
diffusion-ql, fql). After ``--agent NAME`` come the loop options (``--dataset``, ``--env``,
``--total-steps``, ...) and NAME's hyperparameters, as for ``jaxrl train NAME``;
``--agent NAME --help`` lists them. This script runs the same path as ``jaxrl train``.

The env comes from the dataset's metadata unless --env is given. Training evaluates the
deterministic policy in that env every --eval-every gradient steps and reports the D4RL
normalized score. Rerunning the same command resumes.
"""

from __future__ import annotations

import argparse

from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.loops import TrainConfig
from jaxrl.run import train

# This script's loop defaults (gradient steps); every one can be overridden on the command line.
DEFAULTS = TrainConfig(env="", total_steps=1_000_000, eval_every=10_000, log_every=5_000)


def main(argv: list[str] | None = None) -> dict:
    """Pick the agent, parse its options, then run the shared offline loop."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--agent", default="iql", choices=registry.names("offline"))
    args, rest = p.parse_known_args(argv)
    cfg, agent_cfg = parse_train_args(args.agent, rest, DEFAULTS)
    if not cfg.dataset:
        raise SystemExit("Pass --dataset PATH (a D4RL .hdf5 file, a Minari directory, minari:ID).")

    # Dataset -> env (from its metadata unless --env), validated against the env's spaces; the
    # agent gets the dataset's statistics; the dataset becomes a device-resident replay buffer;
    # then the offline loop: lax.scan'd updates on the device, eval, logging, checkpoints.
    summary = train(args.agent, cfg, agent_cfg)
    if summary["completed"]:
        print(
            f"final eval return {summary['final_eval_return_mean']:.1f}, normalized "
            f"score {summary['normalized_score']}"
        )
    return summary


if __name__ == "__main__":
    main()
