"""``jaxrl train``'s runs: the loop an agent's registry entry and the options call for, set up.

``train`` picks the loop (host, fused, offline, offline-to-online, online with a dataset), makes
the envs or loads the dataset, prepares the run directory (one per seed with ``--num-seeds``) and
returns the run's summary. ``jaxrl.cli.train`` parses the command line and calls it; sweeps and
tuners call it too, in worker processes through ``train_job(TrainJob(...))``.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import closing
from typing import Any

from jaxrl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TrainJob:
    """One ``train`` call as a value, to hand to a worker process (``train_job``).

    Attributes:
        agent_name: a registered agent.
        train_cfg: the loop options (a ``TrainConfig``).
        agent_cfg: the agent's config.
    """

    agent_name: str
    train_cfg: Any
    agent_cfg: Any


def train_job(job: TrainJob) -> dict[str, Any]:
    """``train(job.agent_name, job.train_cfg, job.agent_cfg)``: the entry of a worker process."""
    return train(job.agent_name, job.train_cfg, job.agent_cfg)


def train(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Run ``agent_name`` in the loop its registry entry and the options call for.

    Offline agents train on ``--dataset`` (then online with ``--online-steps``); off-policy
    agents train on host envs, on JAX envs (fused loop) or with a dataset in the minibatch mix;
    on-policy agents train on JAX envs. With ``--num-seeds K > 1`` (JAX envs) each seed gets
    ``OUT/s<seed>`` and the returned summary (also ``OUT/summary.json``) aggregates them.

    Returns:
        The run's summary.
    """
    from jaxrl import registry
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.run.devices import start_processes

    start_processes(train_cfg)  # several processes: before JAX touches a device
    spec = registry.get(agent_name)
    if train_cfg.env:  # settings derived from the env, and the agent's refusals of it
        agent_cfg = spec.for_env(agent_cfg, train_cfg.env)
    if train_cfg.video_every and train_cfg.env:  # before the run directory is made
        from jaxrl.loops.video import check_rendering

        check_rendering(train_cfg.env)
    if train_cfg.dataset:
        return _train_with_dataset(spec, train_cfg, agent_cfg)
    if train_cfg.online_steps or train_cfg.offline_steps is not None:
        raise ConfigError(
            "--offline-steps / --online-steps split a run with --dataset into its offline and "
            "online phases; without a dataset use --total-steps."
        )
    if spec.kind == "offline":
        raise ConfigError(
            f"{spec.name} is an offline agent: pass --dataset PATH (a D4RL .hdf5 file, a Minari "
            "dataset directory or minari:ID); `jaxrl dataset collect` makes one."
        )
    if is_jax_env(train_cfg.env):
        return _train_jax(spec, train_cfg, agent_cfg)
    if spec.kind == "on-policy":
        raise ConfigError(
            f"{spec.name} is on-policy and trains on JAX envs only (the fused loop); use e.g. "
            "--env jax:pendulum or --env brax:inverted_pendulum."
        )
    if train_cfg.num_seeds > 1:
        raise ConfigError(
            "--num-seeds trains seeds in one program and needs a JAX env (brax:NAME or "
            f"jax:NAME); for {train_cfg.env!r} run one process per --seed."
        )
    return _train_host(spec, train_cfg, agent_cfg)


def _train_with_dataset(spec: Any, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Offline (then optionally online) training, or an online agent with a dataset (RLPD)."""
    from jaxrl import registry
    from jaxrl.run.finetune import train_offline_to_online, train_with_data

    if train_cfg.num_seeds > 1 and (not spec.offline or train_cfg.online_steps):
        raise ConfigError(
            "--num-seeds with --dataset vmaps the seeds of an offline agent's offline phase; for "
            "online or offline-to-online training with data run one process per --seed."
        )
    if spec.offline:  # offline agents, and on-policy agents that pretrain on the data
        if train_cfg.online_steps:
            return train_offline_to_online(spec, agent_cfg, train_cfg)
        return _train_offline(spec, train_cfg, agent_cfg)
    if spec.kind == "on-policy":
        raise ConfigError(
            f"{spec.name} is on-policy and cannot reuse a dataset; with --dataset use an "
            f"off-policy agent ({', '.join(registry.names('off-policy'))}) or an offline one "
            f"({', '.join(registry.names('offline'))})."
        )
    return train_with_data(spec, agent_cfg, train_cfg)


def _train_host(spec: Any, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Gymnasium envs and a fresh agent in the host loop."""
    from jaxrl.envs import make_env
    from jaxrl.loops import default_out, prepare_run_dir, run_config, train_host

    n = train_cfg.num_envs or 1
    with closing(make_env(train_cfg.env, n)) as env:
        with closing(make_env(train_cfg.env, train_cfg.eval_episodes)) as eval_env:
            out = train_cfg.out or default_out(spec.name, train_cfg)
            prepare_run_dir(out, run_config(spec.name, agent_cfg, train_cfg))
            obs, act = env.obs_example, env.action_example
            agent = spec.agent.create(agent_cfg, obs, act, train_cfg.seed)
            return train_host(spec, agent, env, eval_env, train_cfg, out)


def _train_offline(spec: Any, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Load and validate the dataset, build the eval env, then run the offline loop."""
    from jaxrl.loops import default_out, prepare_run_dir, run_config, train_offline
    from jaxrl.loops.evaluation import close_envs
    from jaxrl.run.offline import setup_offline

    out = train_cfg.out or default_out(spec.name, train_cfg)
    if train_cfg.num_seeds > 1:  # the seeds as members of one vmapped program
        from jaxrl.run.members import Member, Program
        from jaxrl.run.programs import run_offline

        outs = _seed_dirs(spec, train_cfg, agent_cfg, out)
        seeds = [train_cfg.seed + i for i in range(len(outs))]
        members = [Member({}, s, agent_cfg, o) for s, o in zip(seeds, outs, strict=True)]
        summaries = run_offline(spec, train_cfg, Program(agent_cfg, {}, members))
        return _seeds_summary(spec, train_cfg, out, outs, summaries)
    s = setup_offline(spec, agent_cfg, train_cfg, out)
    try:
        config = run_config(spec.name, s.agent_config, s.train_config)
        prepare_run_dir(out, {**config, "dataset_info": s.run_config_extras()})
        score = s.dataset.normalized_score
        return train_offline(spec, s.agent, s.data, s.eval_env, s.train_config, out, score_fn=score)
    finally:
        close_envs(s.eval_env)


def _train_jax(spec: Any, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """JAX envs in the fused loop, ``--num-seeds`` members in one program."""
    import dataclasses as dc

    from jaxrl.loops import default_out, prepare_run_dir, run_config, train_fused
    from jaxrl.run.runs import jax_num_envs, make_jax_envs

    num_envs = jax_num_envs(spec, train_cfg.num_envs)
    train_cfg = dc.replace(train_cfg, num_envs=num_envs)
    env, eval_env = make_jax_envs(train_cfg.env, num_envs, train_cfg.eval_episodes, agent_cfg, spec)
    agent_cfg = spec.with_actor_observation(agent_cfg, env)
    out = train_cfg.out or default_out(spec.name, train_cfg)
    outs = _seed_dirs(spec, train_cfg, agent_cfg, out)
    for i, o in enumerate(outs):
        seed_cfg = dc.replace(train_cfg, seed=train_cfg.seed + i, num_seeds=1, out=o)
        prepare_run_dir(o, run_config(spec.name, agent_cfg, seed_cfg))
    summaries = train_fused(spec, agent_cfg, env, eval_env, train_cfg, outs)
    return _seeds_summary(spec, train_cfg, out, outs, summaries)


def _mean_or_none(values: list[float | None], completed: bool) -> float | None:
    """The mean of the seeds' values, or None when a seed has none or did not complete."""
    if not completed or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _seed_dirs(spec: Any, train_cfg: Any, agent_cfg: Any, out: str) -> list[str]:
    """``[out]``, or ``OUT/s<seed>`` per seed of ``--num-seeds`` (``OUT/config.json`` written)."""
    from jaxrl.loops import prepare_run_dir, run_config

    k = train_cfg.num_seeds
    if k == 1:
        return [out]
    prepare_run_dir(out, run_config(spec.name, agent_cfg, train_cfg))
    return [os.path.join(out, f"s{train_cfg.seed + i}") for i in range(k)]


def _seeds_summary(
    spec: Any, train_cfg: Any, out: str, outs: list[str], summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    """The run's summary; with several seeds, their aggregate (``OUT/summary.json``, a plot)."""
    import numpy as np

    from jaxrl.loops.logging import plot_learning_curves, write_json
    from jaxrl.loops.mesh import primary

    if len(outs) == 1:
        return summaries[0]
    finals = [s["final_eval_return_mean"] for s in summaries]
    completed = all(s["completed"] for s in summaries)
    summary = {
        **{key: summaries[0][key] for key in ("agent", "env", "total_steps", "wall_clock_s")},
        "seeds": [s["seed"] for s in summaries],
        "final_eval_return_mean": float(np.mean(finals)) if completed else None,
        "final_eval_return_std": float(np.std(finals)) if completed else None,
        "final_eval_return_per_seed": finals,
        "normalized_score": _mean_or_none([s["normalized_score"] for s in summaries], completed),
        "env_steps_per_s": sum(s["env_steps_per_s"] for s in summaries),
        "updates_per_s": sum(s["updates_per_s"] for s in summaries),
        "completed": completed,
        "status": _worst_status(summaries),
    }
    if not primary():  # several processes: process 0 writes the run directory
        return summary
    write_json(os.path.join(out, "summary.json"), summary)
    curves = {os.path.basename(o): os.path.join(o, "metrics.csv") for o in outs}
    where = train_cfg.dataset or train_cfg.env
    plot_learning_curves(curves, os.path.join(out, "learning_curve.png"), f"{spec.name} on {where}")
    return summary


def _worst_status(summaries: list[dict[str, Any]]) -> str:
    """'diverged' if any member diverged, else 'stopped' if any stopped, else 'completed'."""
    statuses = {s.get("status", "completed") for s in summaries}
    for status in ("diverged", "stopped"):
        if status in statuses:
            return status
    return "completed"
