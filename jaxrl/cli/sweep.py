"""``jaxrl sweep``: grid sweeps (``jaxrl.tune.grid``) and Optuna / Ray Tune searches."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import numpy as np

from jaxrl.cli.train import parse_train_args
from jaxrl.errors import ConfigError
from jaxrl.run.fields import field_kinds
from jaxrl.run.members import parse_grid
from jaxrl.tune.grid import sweep


def _sweep_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxrl sweep",
        description=(
            "Sweep settings x seeds. Any other option is a `jaxrl train AGENT` option (the "
            "base config; --out is the sweep's root)."
        ),
    )
    p.add_argument("agent")
    p.add_argument("--seeds", type=int, default=1, help="seeds per setting (--seed, --seed+1, ..)")
    p.add_argument("--grid", action="append", default=[], help="FIELD=V1,V2,... (repeatable)")
    p.add_argument("--no-split", action="store_true", help="refuse static fields in the grid")
    p.add_argument("--list-fields", action="store_true", help="print leaf/static per field")
    p.add_argument("--workers", type=int, default=None, help="host envs: processes at once")
    p.add_argument("--backend", choices=("grid", "optuna", "ray"), default="grid")
    p.add_argument("--search", action="append", default=[], help="FIELD=DIST:ARGS (optuna, ray)")
    p.add_argument("--trials", type=int, default=None, help="optuna/ray: number of trials")
    p.add_argument("--storage", default=None, help="optuna: RDB URL (default OUT/sweep.db)")
    p.add_argument("--study-name", default=None, help="optuna: the study to create or join")
    p.add_argument("--n-jobs", type=int, default=1, help="optuna: worker processes")
    p.add_argument("--address", default=None, help="ray: cluster address (default: local)")
    p.add_argument("--scheduler", choices=("fifo", "asha", "pbt"), default="fifo")
    return p


def sweep_command(argv: list[str]) -> dict[str, Any]:
    """``jaxrl sweep AGENT [--grid F=V1,V2 ...] [--seeds N] [--backend ...] [train options]``."""
    from jaxrl import registry

    args, rest = _sweep_parser().parse_known_args(argv)
    spec = registry.get(args.agent)
    train_cfg, base = parse_train_args(args.agent, rest)
    if spec.env_defaults is not None and train_cfg.env:
        from jaxrl.envs import episode_length

        base = spec.with_env_defaults(base, episode_length(train_cfg.env))
    if args.list_fields:
        kinds = field_kinds(spec, base, np.zeros(3, np.float32), np.zeros(1, np.float32))
        for name, kind in kinds.items():
            print(f"{name:32s} {kind}")
        return {"kinds": kinds}
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}.")
    where = os.path.splitext(os.path.basename(os.path.normpath(train_cfg.dataset or "")))[0]
    name = f"{args.agent}-{where or train_cfg.env}".replace(":", "_")
    out_root = os.path.abspath(train_cfg.out or os.path.join("sweeps", name))
    if train_cfg.dataset:
        train_cfg = dataclasses.replace(train_cfg, dataset=os.path.abspath(train_cfg.dataset))
    if args.backend == "grid":
        if args.search:
            raise ConfigError("--search belongs to --backend optuna or ray; the grid uses --grid.")
        grid = parse_grid(args.grid, spec.config)
        seeds = [train_cfg.seed + i for i in range(args.seeds)]
        return sweep(spec, train_cfg, base, grid, seeds, out_root, split=not args.no_split)
    from jaxrl import tune as tuning

    if args.grid:
        raise ConfigError("--grid belongs to --backend grid; optuna and ray take --search.")
    search = tuning.parse_search(args.search, spec.config, base=base)
    trials = args.trials or 10
    common = {"trials": trials, "out_root": out_root, "seed": train_cfg.seed}
    if args.backend == "optuna":
        return tuning.optuna_sweep(
            args.agent, train_cfg, base, search, storage=args.storage,
            study_name=args.study_name, n_jobs=args.n_jobs, **common,
        )  # fmt: skip
    return tuning.ray_sweep(
        args.agent, train_cfg, base, search, address=args.address, scheduler=args.scheduler,
        **common,
    )  # fmt: skip
