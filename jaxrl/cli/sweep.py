"""``jaxrl sweep``: grid sweeps (``jaxrl.tune.grid``) and Optuna / Ray Tune searches.

The sweep's options, ``--config`` and every ``jaxrl train AGENT`` option (the base config;
``--out`` is the sweep's root) are one tyro parser, so ``jaxrl sweep AGENT --help`` lists them all.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Annotated, Any, Literal

import tyro

from jaxrl.cli.common import guard
from jaxrl.cli.train import agent_spec, config_defaults, train_args_class, train_configs
from jaxrl.errors import ConfigError

APPEND = tyro.conf.UseAppendAction


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """The options of ``jaxrl sweep`` besides the train options."""

    seeds: int = 1
    """seeds per setting (--seed, --seed+1, ..)"""
    grid: Annotated[tuple[str, ...], APPEND, tyro.conf.arg(metavar="FIELD=V1,V2")] = ()
    """the values of a config field (repeatable)"""
    no_split: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """refuse static fields in the grid"""
    list_fields: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """print leaf/static per field"""
    workers: int | None = None
    """host envs: processes at once"""
    backend: Literal["grid", "optuna", "ray"] = "grid"
    """grid sweep, or an Optuna / Ray Tune search"""
    search: Annotated[tuple[str, ...], APPEND, tyro.conf.arg(metavar="FIELD=DIST:ARGS")] = ()
    """a searched field (optuna, ray; repeatable)"""
    trials: int | None = None
    """optuna/ray: number of trials (default 10)"""
    storage: str | None = None
    """optuna: RDB URL (default OUT/sweep.db)"""
    study_name: str | None = None
    """optuna: the study to create or join"""
    n_jobs: int = 1
    """optuna: worker processes"""
    address: str | None = None
    """ray: cluster address (default: local)"""
    scheduler: Literal["fifo", "asha", "pbt"] = "fifo"
    """ray: trial scheduler"""


def run(argv: list[str]) -> None:
    """``jaxrl sweep AGENT ...``: sweep and print one JSON line (``--list-fields``: the table)."""
    if not argv or argv[0].startswith("-"):
        if any(a in ("-h", "--help") for a in argv):
            tyro.cli(SweepOptions, args=["--help"], prog="jaxrl sweep AGENT")
        raise SystemExit("usage: jaxrl sweep AGENT [options]; see jaxrl sweep AGENT --help.")
    result = guard(lambda: sweep_command(argv))
    keys = ("out", "programs", "best_value", "best_params", "best_config", "n_trials")
    if "kinds" not in result or "settings" in result:  # not --list-fields
        print(json.dumps({k: result[k] for k in keys if k in result}, default=str))


def parse_sweep_args(agent_name: str, argv: list[str]) -> tuple[SweepOptions, Any, Any]:
    """``(SweepOptions, TrainConfig, agent config)`` of ``jaxrl sweep AGENT`` options."""
    from jaxrl import registry

    registry.get(agent_name)  # an unknown agent is a ConfigError naming the agents
    spec = agent_spec(agent_name)
    omit = tyro.conf.OmitArgPrefixes
    sweep_field = (
        "sweep",
        Annotated[SweepOptions, omit],
        dataclasses.field(default=SweepOptions()),
    )
    args_cls = train_args_class(spec, config_defaults(spec, argv), extra=(sweep_field,))
    description = (
        "Sweep settings x seeds. The other options are `jaxrl train AGENT` options (the base "
        "config; --out is the sweep's root)."
    )
    args = tyro.cli(args_cls, args=argv, prog=f"jaxrl sweep {agent_name}", description=description)
    return (args.sweep, *train_configs(args, argv))


def sweep_command(argv: list[str]) -> dict[str, Any]:
    """``jaxrl sweep AGENT [--grid F=V1,V2 ...] [--seeds N] [--backend ...] [train options]``."""
    import numpy as np

    from jaxrl import registry
    from jaxrl.run.fields import field_kinds
    from jaxrl.run.members import parse_grid
    from jaxrl.tune.grid import sweep

    agent = argv[0]
    args, train_cfg, base = parse_sweep_args(agent, argv[1:])
    spec = registry.get(agent)
    if train_cfg.env:
        base = spec.for_env(base, train_cfg.env)
    if args.list_fields:
        kinds = field_kinds(spec, base, np.zeros(3, np.float32), np.zeros(1, np.float32))
        for name, kind in kinds.items():
            print(f"{name:32s} {kind}")
        return {"kinds": kinds}
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}.")
    where = os.path.splitext(os.path.basename(os.path.normpath(train_cfg.dataset or "")))[0]
    name = f"{agent}-{where or train_cfg.env}".replace(":", "_")
    out_root = os.path.abspath(train_cfg.out or os.path.join("sweeps", name))
    if train_cfg.dataset:
        train_cfg = dataclasses.replace(train_cfg, dataset=os.path.abspath(train_cfg.dataset))
    if args.backend == "grid":
        if args.search:
            raise ConfigError("--search belongs to --backend optuna or ray; the grid uses --grid.")
        grid = parse_grid(list(args.grid), spec.config)
        seeds = [train_cfg.seed + i for i in range(args.seeds)]
        return sweep(
            spec, train_cfg, base, grid, seeds, out_root, split=not args.no_split,
            workers=args.workers,
        )  # fmt: skip
    from jaxrl import tune as tuning

    if args.grid:
        raise ConfigError("--grid belongs to --backend grid; optuna and ray take --search.")
    search = tuning.parse_search(list(args.search), spec.config, base=base)
    trials = args.trials or 10
    job = tuning.Sweep.of(
        agent, train_cfg, base, search, trials=trials, out_root=out_root, seed=train_cfg.seed
    )
    if args.backend == "optuna":
        return tuning.optuna_sweep(
            job, storage=args.storage, study_name=args.study_name, n_jobs=args.n_jobs
        )
    return tuning.ray_sweep(job, address=args.address, scheduler=args.scheduler)
