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
the programs are planned in ``jaxrl.run.members``; this module runs them.

Host (Gymnasium) envs run each member as a normal ``jaxrl train`` in worker processes, at
most as many at once as there are cores. Each member writes a complete run directory
``OUT/<setting>/s<seed>`` (it resumes and evaluates on its own); ``OUT/sweep.md`` and
``OUT/sweep.json`` aggregate the final returns per setting, and ``OUT/learning_curves.{png,md}``
(``jaxrl plot``) show the curves with bootstrap bands and the IQM table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from jaxrl.registry import AgentSpec
from jaxrl.run.fields import (
    LOOP_FIELDS,
    classify,
    field_kinds,
    graft,
    loop_fields,
)
from jaxrl.run.members import (
    Member,
    Program,
    parse_grid,
    plan,
    setting_label,
    settings,
)
from jaxrl.run.programs import member_train_config, run_fused, run_offline
from jaxrl.run.train import TrainJob, train_job
from jaxrl.tune.workers import pool_size, run_pool


def run_host(
    spec: AgentSpec, train_cfg: Any, members: list[Member], workers: int | None = None
) -> list[dict[str, Any]]:
    """Train each member as its own ``jaxrl train`` in worker processes (Gymnasium envs).

    At most ``workers`` (default: the number of cores) run at once, in the spawn pool of
    ``jaxrl.tune.workers`` (fresh processes, so JAX never forks).
    """
    cfg = dataclasses.replace(train_cfg, progress=False)
    jobs = [TrainJob(spec.name, member_train_config(cfg, m), m.config) for m in members]
    return run_pool(train_job, jobs, workers)


def aggregate(members: list[Member], out_root: str) -> list[dict[str, Any]]:
    """Per setting: final evaluation returns over seeds; writes ``sweep.md`` and ``sweep.json``."""
    from jaxrl.loops.logging import write_json

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
    from jaxrl.loops.logging import write_json

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
        n = pool_size(workers, len(members))
        print(f"{len(members)} members as separate runs, {n} worker processes at a time.")
        run_host(spec, train_cfg, members, workers)
    table = aggregate(members, out_root)
    from jaxrl.analysis.curves import plot_runs

    plot_runs([out_root], os.path.join(out_root, "learning_curves.png"))
    return {"programs": len(programs), "kinds": kinds, "settings": table, "out": out_root}


__all__ = [
    "LOOP_FIELDS",
    "Member",
    "Program",
    "aggregate",
    "classify",
    "field_kinds",
    "graft",
    "loop_fields",
    "parse_grid",
    "plan",
    "run_host",
    "settings",
    "setting_label",
    "sweep",
    "vmapped",
]
