"""Sweeps of settings x seeds: ``jaxrl sweep AGENT --grid FIELD=V1,V2 ... --seeds N``.

On JAX envs (the fused loop) and for offline agents (the dataset already on the device) the
grid x seeds trains as one vmapped program, compiled once. That works because every value a
user sweeps inside a program is a pytree leaf of the agent (learning rates in the optimizer
state via ``optax.inject_hyperparams``, ``tau``, the discount and loss weights in ``hparams``):
each member is created from its own config, then given the program's shared config as its
static field (``agent.replace(config=...)``), so the members' pytrees have one structure and
stack on a leading axis.

A field is a **leaf** when changing it changes only leaf values of a created agent, with the
same shapes, and no loop reads it. Everything else is **static**: shapes (``hidden_dims``,
``num_qs``), the fields the loops read (``batch_size``, ``utd_ratio``, ``learning_starts``,
``buffer_size``, the schedule horizon, the sequence length, the discount of Monte-Carlo
returns), and fields only the update's Python code reads (``num_min_qs``, ``policy_q``,
``policy_delay``, clip settings...). A static field splits the sweep into one program per
value (``--no-split`` refuses instead). The classification is made by creating agents, so it
holds for any registered agent; ``jaxrl sweep AGENT --list-fields`` prints it. The grid and
the programs are planned in ``jaxrl.sweep_plan``; this module runs them.

Host (Gymnasium) envs run each member as a normal ``jaxrl train`` in worker processes, at
most as many at once as there are cores. Each member writes a complete run directory
``OUT/<setting>/s<seed>`` (it resumes and evaluates on its own); ``OUT/sweep.md`` and
``OUT/sweep.json`` aggregate the final returns per setting, and ``OUT/learning_curves.{png,md}``
(``jaxrl plot``) show the curves with bootstrap bands and the IQM table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import ConfigError
from jaxrl.registry import AgentSpec
from jaxrl.sweep_fields import (
    LOOP_FIELDS,
    classify,
    field_kinds,
    graft,
    layout_matches,
    loop_fields,
)
from jaxrl.sweep_plan import (
    Member,
    Program,
    parse_grid,
    plan,
    setting_label,
    settings,
)

# ------------------------------------------------------------------------- the programs


def member_agents(spec: AgentSpec, program: Program, make: Any) -> Any:
    """The program's members' agents, each made by ``make(config, seed)``, stacked."""
    agents = [graft(make(m.config, m.seed), program.config) for m in program.members]
    for m, agent in zip(program.members, agents, strict=True):
        if not layout_matches(agent, agents[0]):
            raise ConfigError(
                f"Member {m.label} has another structure than {program.members[0].label}; a "
                "static field varies inside one program (report this: the classification "
                "missed it)."
            )
    # The members' static parts (configs, optimizer transforms, module definitions) are equal
    # but distinct objects: the first member's stand for all.
    stacked = [jnp.stack(xs) for xs in zip(*map(jax.tree.leaves, agents), strict=True)]
    return jax.tree.unflatten(jax.tree.structure(agents[0]), stacked)


# ------------------------------------------------------------------------------ running


def _member_train_config(train_cfg: Any, member: Member) -> Any:
    return dataclasses.replace(train_cfg, seed=member.seed, out=member.out, num_seeds=1)


def _prepare(spec: AgentSpec, train_cfg: Any, member: Member, extra: dict | None = None) -> None:
    from jaxrl.loops import prepare_run_dir, run_config

    config = run_config(spec.name, member.config, _member_train_config(train_cfg, member))
    prepare_run_dir(member.out, config | (extra or {}))


def run_fused(spec: AgentSpec, train_cfg: Any, program: Program) -> list[dict[str, Any]]:
    """Train a program's members on a JAX env as one vmapped fused loop."""
    from jaxrl.loops import train_fused
    from jaxrl.runs import make_jax_envs

    num_envs = train_cfg.num_envs or (1 if spec.kind == "planner" else 64)
    cfg = dataclasses.replace(train_cfg, num_envs=num_envs, num_seeds=1)
    env, eval_env = make_jax_envs(cfg.env, num_envs, cfg.eval_episodes, program.config, spec)
    members = [
        dataclasses.replace(m, config=spec.with_actor_observation(m.config, env))
        for m in program.members
    ]
    config = spec.with_actor_observation(program.config, env)
    program = dataclasses.replace(program, config=config, members=members)
    for m in program.members:
        _prepare(spec, cfg, m)
    obs = jnp.zeros(env.observation_size, jnp.float32)
    act = jnp.zeros(env.action_size, jnp.float32)
    agents = member_agents(spec, program, lambda c, s: spec.agent.create(c, obs, act, s))
    outs = [m.out for m in program.members]
    seeds = [m.seed for m in program.members]
    return train_fused(spec, program.config, env, eval_env, cfg, outs, seeds=seeds, agents=agents)


def run_offline(spec: AgentSpec, train_cfg: Any, program: Program) -> list[dict[str, Any]]:
    """Train a program's offline members on the shared device-resident dataset, vmapped."""
    from jaxrl.evaluation import close_envs
    from jaxrl.loops import train_offline
    from jaxrl.offline.common import with_data_norm
    from jaxrl.offline.setup import setup_offline

    s = setup_offline(spec, program.config, train_cfg, program.members[0].out)
    horizon = {}
    if spec.horizon_field is not None:  # the schedule's horizon the setup resolved
        horizon = {spec.horizon_field: getattr(s.agent_config, spec.horizon_field)}
    config = dataclasses.replace(s.agent_config, **horizon)
    program = Program(
        config,
        program.static,
        [
            dataclasses.replace(m, config=dataclasses.replace(m.config, **horizon))
            for m in program.members
        ],
    )
    cfg = s.train_config
    for m in program.members:
        _prepare(spec, cfg, m, {"dataset_info": s.run_config_extras()})
    obs = np.zeros(s.dataset.obs_dim, np.float32)
    act = np.zeros(s.dataset.action_dim, np.float32)

    def make(c: Any, seed: int) -> Any:
        return with_data_norm(spec, spec.agent.create(c, obs, act, seed), s.dataset)

    agents = member_agents(spec, program, make)
    outs = [m.out for m in program.members]
    seeds = [m.seed for m in program.members]
    summaries = train_offline(
        spec,
        agents,
        s.data,
        s.eval_env,
        cfg,
        outs,
        seeds=seeds,
        score_fn=s.dataset.normalized_score,
    )
    close_envs(s.eval_env)
    return summaries


def _train_member(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    from jaxrl.train_runs import train

    return train(agent_name, train_cfg, agent_cfg)


def run_host(
    spec: AgentSpec, train_cfg: Any, members: list[Member], workers: int | None = None
) -> list[dict[str, Any]]:
    """Train each member as its own ``jaxrl train`` in worker processes (Gymnasium envs).

    At most ``workers`` (default: the number of cores) run at once; each is a fresh process
    (``spawn``), so JAX never forks.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    workers = max(1, min(workers or os.cpu_count() or 1, len(members)))
    cfg = dataclasses.replace(train_cfg, progress=False)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(_train_member, spec.name, _member_train_config(cfg, m), m.config)
            for m in members
        ]
        return [f.result() for f in futures]


def aggregate(members: list[Member], out_root: str) -> list[dict[str, Any]]:
    """Per setting: final evaluation returns over seeds; writes ``sweep.md`` and ``sweep.json``."""
    from jaxrl.logging import write_json

    rows: dict[str, dict[str, Any]] = {}
    for m in members:
        path = os.path.join(m.out, "summary.json")
        final = None
        if os.path.exists(path):
            with open(path) as f:
                final = json.load(f).get("final_eval_return_mean")
        row = rows.setdefault(m.label, {"setting": m.setting, "seeds": [], "returns": []})
        row["seeds"].append(m.seed)
        row["returns"].append(final)
    table = []
    for label, row in rows.items():
        done = [r for r in row["returns"] if r is not None and math.isfinite(r)]
        mean = float(np.mean(done)) if done else None
        std = float(np.std(done)) if done else None
        table.append({"label": label, **row, "mean": mean, "std": std})
    table.sort(key=lambda r: -math.inf if r["mean"] is None else r["mean"], reverse=True)
    write_json(os.path.join(out_root, "sweep.json"), {"settings": table})
    lines = ["| setting | seeds | final return mean | std | per seed |", "|---|---|---|---|---|"]
    for r in table:
        per = ", ".join("-" if x is None else f"{x:.1f}" for x in r["returns"])
        mean = "-" if r["mean"] is None else f"{r['mean']:.1f}"
        std = "-" if r["std"] is None else f"{r['std']:.1f}"
        lines.append(f"| {r['label']} | {len(r['seeds'])} | {mean} | {std} | {per} |")
    with open(os.path.join(out_root, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def vmapped(spec: AgentSpec, train_cfg: Any) -> bool:
    """True when the members train as vmapped programs (JAX env, or offline on a dataset)."""
    from jaxrl.envs.jax_envs import is_jax_env

    if train_cfg.dataset:
        return spec.kind == "offline" and not train_cfg.online_steps
    return is_jax_env(train_cfg.env)


def sweep(
    spec: AgentSpec,
    train_cfg: Any,
    base: Any,
    grid: dict[str, tuple],
    seeds: list[int],
    out_root: str,
    *,
    split: bool = True,
    workers: int | None = None,
) -> dict[str, Any]:
    """Train the grid x seeds; returns ``{"programs", "kinds", "settings"}`` (the aggregate).

    Vmapped (``vmapped``): one program per combination of the static fields' values, each
    compiled once for all its members. Otherwise: one ``jaxrl train`` per member in worker
    processes. Rerunning the same sweep resumes every member from its checkpoints.
    """
    from jaxrl.logging import write_json

    obs, act = np.zeros(3, np.float32), np.zeros(1, np.float32)
    kinds = classify(spec, base, grid, obs, act)  # a bad grid value fails here, before any file
    programs = plan(spec, base, grid, kinds, seeds, out_root, split=split)
    os.makedirs(out_root, exist_ok=True)
    members = [m for p in programs for m in p.members]
    leaves = [k for k, v in kinds.items() if v == "leaf"]
    static = [k for k, v in kinds.items() if v == "static" and len(grid[k]) > 1]
    record = {
        "agent": spec.name,
        "env": train_cfg.env,
        "dataset": train_cfg.dataset,
        "grid": {k: list(v) for k, v in grid.items()},
        "seeds": seeds,
        "kinds": kinds,
    }
    write_json(os.path.join(out_root, "sweep_config.json"), record)
    if vmapped(spec, train_cfg):
        print(
            f"{len(members)} members ({len(members) // len(seeds)} settings x {len(seeds)} seeds)"
            f"; leaves vary inside a program: {', '.join(leaves) or 'none'}; "
            + (
                f"static {', '.join(static)} split the sweep into {len(programs)} programs."
                if static
                else "one program."
            )
        )
        run = run_offline if spec.kind == "offline" else run_fused
        for i, program in enumerate(programs):
            if len(programs) > 1:
                print(f"program {i + 1}/{len(programs)}: {setting_label(program.static)}")
            run(spec, train_cfg, program)
    else:
        n = max(1, min(workers or os.cpu_count() or 1, len(members)))
        print(f"{len(members)} members as separate runs, {n} worker processes at a time.")
        run_host(spec, train_cfg, members, workers)
    table = aggregate(members, out_root)
    from jaxrl.analysis import plot_command

    plot_command([out_root, "--out", os.path.join(out_root, "learning_curves.png")])
    return {"programs": len(programs), "kinds": kinds, "settings": table, "out": out_root}


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
    from jaxrl.cli import parse_train_args

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
    from jaxrl import tuning

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


__all__ = [
    "LOOP_FIELDS",
    "Member",
    "Program",
    "aggregate",
    "classify",
    "field_kinds",
    "graft",
    "loop_fields",
    "member_agents",
    "parse_grid",
    "plan",
    "run_fused",
    "run_host",
    "run_offline",
    "settings",
    "setting_label",
    "sweep",
    "sweep_command",
    "vmapped",
]
