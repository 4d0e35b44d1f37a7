"""The ``jaxrl`` command line: ``jaxrl train AGENT ...``, ``jaxrl eval DIR``, ``jaxrl plot``.

``jaxrl train AGENT --help`` lists every loop option and agent hyperparameter with its docstring.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Annotated, Any

USAGE = """usage: jaxrl {{train,finetune,eval,dataset,plot}} ...

  jaxrl train AGENT --env ENV [--total-steps N] [--seed S] [--num-envs E] [--out DIR]
                    [--eval-every N] [--eval-episodes N] [agent options...]
  jaxrl train AGENT --dataset PATH|minari:ID [--env ENV] ...   offline agents
  jaxrl train AGENT --dataset D --env E --offline-steps N --online-steps M   offline-to-online
  jaxrl train rlpd --env E --dataset D [--total-steps M] [--offline-ratio 0.5]   online + data
  jaxrl finetune DIR --online-steps M [--offline-ratio R]   continue an offline run online
  jaxrl dataset collect --env ENV --policy RUN_DIR --kind KIND --steps N --out FILE.hdf5
  jaxrl dataset info FILE [--env ENV]   size, episodes, returns, reference scores
  jaxrl eval DIR [--episodes N]      print one JSON line with the evaluation return
  jaxrl plot DIR [DIR ...] [--out FILE]   plot eval return against steps

agents: {agents}
`jaxrl train AGENT --help` lists every option with its documentation.
"""


def _agents() -> dict[str, Any]:
    from jaxrl.runs import agent_registry

    return agent_registry()


def _usage() -> str:
    return USAGE.format(agents=", ".join(_agents()))


def parse_train_args(agent_name: str, argv: list[str]) -> tuple[Any, Any]:
    """Parse ``jaxrl train AGENT`` options into ``(TrainConfig, agent config)`` with tyro."""
    import tyro

    from jaxrl.training import TrainConfig

    agents = _agents()
    if agent_name not in agents:
        raise SystemExit(f"Unknown agent {agent_name!r}; choose one of: {', '.join(agents)}.")
    _, config_cls = agents[agent_name]
    omit = tyro.conf.OmitArgPrefixes
    args_cls = dataclasses.make_dataclass(
        f"Train{config_cls.__name__}",
        [
            ("train", Annotated[TrainConfig, omit], dataclasses.field(default_factory=TrainConfig)),
            ("agent", Annotated[config_cls, omit], dataclasses.field(default_factory=config_cls)),
        ],
    )
    args = tyro.cli(
        args_cls,
        args=argv,
        prog=f"jaxrl train {agent_name}",
        description=f"Train {agent_name} online. Resumes when --out holds a checkpoint.",
    )
    train_cfg = args.train
    env_given = any(a == "--env" or a.startswith("--env=") for a in argv)
    if train_cfg.dataset and not env_given:
        train_cfg = dataclasses.replace(train_cfg, env="")  # "": the dataset's env (train())
    return train_cfg, args.agent


def train(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Build envs and agent, then run the shared host or fused loop; returns the summary.

    With ``--num-seeds K > 1`` (JAX envs) each seed gets ``OUT/s<seed>`` and the returned summary
    (also ``OUT/summary.json``) aggregates them.
    """
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.offline import OFFLINE_AGENTS

    agent_cls, _ = _agents()[agent_name]
    if train_cfg.dataset:
        from jaxrl.offline.finetune import train_offline_to_online, train_with_data

        if agent_name in OFFLINE_AGENTS:
            if train_cfg.online_steps:
                return train_offline_to_online(agent_name, agent_cls, agent_cfg, train_cfg)
            return _train_offline(agent_name, train_cfg, agent_cfg)
        if getattr(agent_cls, "on_policy", False):
            raise ValueError(
                f"{agent_name} is on-policy and cannot reuse a dataset; with --dataset use an "
                "off-policy agent (rlpd, sac, td3) or an offline one "
                f"({', '.join(OFFLINE_AGENTS)})."
            )
        return train_with_data(agent_name, agent_cls, agent_cfg, train_cfg)
    if train_cfg.online_steps or train_cfg.offline_steps is not None:
        raise ValueError(
            "--offline-steps / --online-steps split a run with --dataset into its offline and "
            "online phases; without a dataset use --total-steps."
        )
    if agent_name in OFFLINE_AGENTS:
        raise ValueError(
            f"{agent_name} is an offline agent: pass --dataset PATH (a D4RL .hdf5 file, a Minari "
            "dataset directory or minari:ID); `jaxrl dataset collect` makes one."
        )
    if is_jax_env(train_cfg.env):
        return _train_jax(agent_name, train_cfg, agent_cfg)
    if getattr(agent_cls, "on_policy", False):
        raise ValueError(
            f"{agent_name} is on-policy and trains on JAX envs only (the fused loop); use e.g. "
            "--env jax:pendulum or --env brax:inverted_pendulum."
        )
    if train_cfg.num_seeds > 1:
        raise ValueError(
            "--num-seeds trains seeds in one program and needs a JAX env (brax:NAME or "
            f"jax:NAME); for {train_cfg.env!r} run one process per --seed."
        )
    from jaxrl.envs import make_env
    from jaxrl.training import default_out, prepare_run_dir, run_config, train_host

    num_envs = train_cfg.num_envs or 1
    env = make_env(train_cfg.env, num_envs)
    eval_env = make_env(train_cfg.env, train_cfg.eval_episodes)
    out = train_cfg.out or default_out(agent_name, train_cfg)
    prepare_run_dir(out, run_config(agent_name, agent_cfg, train_cfg))
    agent = agent_cls.create(agent_cfg, env.obs_example, env.action_example, train_cfg.seed)
    summary = train_host(agent, env, eval_env, train_cfg, out, agent_name)
    env.close()
    eval_env.close()
    return summary


def _train_offline(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Load and validate the dataset, build the eval env, then run the offline loop."""
    from jaxrl.offline.setup import setup_offline
    from jaxrl.training import default_out, prepare_run_dir, run_config, train_offline

    out = train_cfg.out or default_out(agent_name, train_cfg)
    s = setup_offline(_agents()[agent_name][0], agent_cfg, train_cfg, out)
    config = run_config(agent_name, s.agent_config, s.train_config)
    prepare_run_dir(out, {**config, "dataset_info": s.run_config_extras()})
    summary = train_offline(
        s.agent, s.data, s.eval_env, s.train_config, out, agent_name, s.dataset.normalized_score
    )
    if hasattr(s.eval_env, "close"):
        s.eval_env.close()
    return summary


def _dataset_score(config: dict[str, Any], ret: float) -> float | None:
    """Normalized score of ``ret`` with the references recorded when the run was trained."""
    from jaxrl.offline import normalized_score, reference_returns

    refs = (config.get("dataset_info") or {}).get("ref_returns")
    return normalized_score(ret, tuple(refs) if refs else reference_returns(config["env"]))


def _train_jax(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    import dataclasses as dc

    import numpy as np

    from jaxrl.logging import plot_learning_curves, write_json
    from jaxrl.runs import make_jax_envs
    from jaxrl.training import default_out, prepare_run_dir, run_config, train_fused

    agent_cls, _ = _agents()[agent_name]
    num_envs = train_cfg.num_envs or 64
    train_cfg = dc.replace(train_cfg, num_envs=num_envs)
    env, eval_env = make_jax_envs(train_cfg.env, num_envs, train_cfg.eval_episodes, agent_cfg)
    out = train_cfg.out or default_out(agent_name, train_cfg)
    k = train_cfg.num_seeds
    if k == 1:
        outs = [out]
    else:
        prepare_run_dir(out, run_config(agent_name, agent_cfg, train_cfg))
        outs = [os.path.join(out, f"s{train_cfg.seed + i}") for i in range(k)]
    for i, o in enumerate(outs):
        seed_cfg = dc.replace(train_cfg, seed=train_cfg.seed + i, num_seeds=1, out=o)
        prepare_run_dir(o, run_config(agent_name, agent_cfg, seed_cfg))
    summaries = train_fused(agent_cls, agent_cfg, env, eval_env, train_cfg, outs, agent_name)
    if k == 1:
        return summaries[0]
    finals = [s["final_eval_return_mean"] for s in summaries]
    completed = all(s["completed"] for s in summaries)
    summary = {
        **{key: summaries[0][key] for key in ("agent", "env", "total_steps", "wall_clock_s")},
        "seeds": [s["seed"] for s in summaries],
        "final_eval_return_mean": float(np.mean(finals)) if completed else None,
        "final_eval_return_std": float(np.std(finals)) if completed else None,
        "final_eval_return_per_seed": finals,
        "normalized_score": None,
        "env_steps_per_s": sum(s["env_steps_per_s"] for s in summaries),
        "updates_per_s": sum(s["updates_per_s"] for s in summaries),
        "completed": completed,
    }
    write_json(os.path.join(out, "summary.json"), summary)
    curves = {os.path.basename(o): os.path.join(o, "metrics.csv") for o in outs}
    plot_learning_curves(
        curves, os.path.join(out, "learning_curve.png"), f"{agent_name} on {train_cfg.env}"
    )
    return summary


def evaluate_run(run_dir: str, episodes: int | None = None) -> dict[str, Any]:
    """Restore the newest checkpoint of ``run_dir`` and evaluate its deterministic policy."""
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.runs import load_run, make_jax_envs
    from jaxrl.training import evaluate, evaluate_jax

    run = load_run(run_dir)
    episodes = episodes or run.train_config.eval_episodes
    env_id = run.config["env"]
    seed = run.train_config.seed + 20_000
    if is_jax_env(env_id):
        import jax

        _, eval_env = make_jax_envs(env_id, 1, episodes, run.agent_config)
        fn = jax.jit(lambda a, s: evaluate_jax(a, eval_env, jax.random.key(seed), s))
        returns = fn(run.agent, run.obs_stats)
    else:
        env = make_env(env_id, episodes)
        returns = evaluate(run.agent, env, seed)
        env.close()
    result = {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "episodes": int(episodes),
        "step": int(run.meta["step"]),
        "agent": run.config["agent"],
        "env": env_id,
    }
    if run.config.get("dataset"):
        result["normalized_score"] = _dataset_score(run.config, result["return_mean"])
    return result


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jaxrl`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        if not rest or rest[0].startswith("-"):
            raise SystemExit(_usage())
        train_cfg, agent_cfg = _guard(lambda: parse_train_args(rest[0], rest[1:]))
        summary = _guard(lambda: train(rest[0], train_cfg, agent_cfg))
        _print_summary(summary)
    elif cmd == "finetune":
        import argparse

        from jaxrl.offline.finetune import finetune_run

        p = argparse.ArgumentParser(
            prog="jaxrl finetune", description="Continue an offline run directory online."
        )
        p.add_argument("run_dir")
        p.add_argument("--online-steps", type=int, required=True, help="env steps online")
        p.add_argument(
            "--offline-ratio", type=float, default=None, help="dataset share of each minibatch"
        )
        a = p.parse_args(rest)
        summary = _guard(lambda: finetune_run(a.run_dir, a.online_steps, a.offline_ratio))
        _print_summary(summary)
    elif cmd == "eval":
        import argparse

        p = argparse.ArgumentParser(prog="jaxrl eval")
        p.add_argument("run_dir")
        p.add_argument("--episodes", type=int, default=None)
        a = p.parse_args(rest)
        print(json.dumps(_guard(lambda: evaluate_run(a.run_dir, a.episodes))))
    elif cmd == "dataset":
        _guard(lambda: dataset_command(rest))
    elif cmd == "plot":
        import argparse

        from jaxrl.logging import plot_learning_curves

        p = argparse.ArgumentParser(prog="jaxrl plot")
        p.add_argument("run_dirs", nargs="+")
        p.add_argument("--out", default="learning_curves.png")
        a = p.parse_args(rest)
        curves = {
            os.path.basename(os.path.normpath(d)): os.path.join(d, "metrics.csv")
            for d in a.run_dirs
        }
        print(plot_learning_curves(curves, a.out))
    else:
        raise SystemExit(f"Unknown command {cmd!r}.\n{_usage()}")


def _print_summary(summary: dict[str, Any]) -> None:
    """The one line ``jaxrl train`` / ``jaxrl finetune`` print when a run completes."""
    if not summary["completed"]:
        return
    if summary.get("dataset") and not summary.get("online_steps"):
        rate = f"{summary['updates_per_s']:.0f} updates/s"
    else:
        rate = f"{summary['env_steps_per_s']:.0f} env steps/s"
    if summary.get("dataset"):
        score = summary["normalized_score"]
        rate += "; normalized score " + ("n/a" if score is None else f"{score:.1f}")
    print(
        f"final eval return: {summary['final_eval_return_mean']:.2f} "
        f"+/- {summary['final_eval_return_std']:.2f} ({rate})"
    )


def dataset_command(argv: list[str]) -> None:
    """``jaxrl dataset collect ...`` (write a D4RL-format file) and ``jaxrl dataset info FILE``."""
    import argparse

    from jaxrl.offline import KINDS, collect, load_dataset, save_d4rl

    p = argparse.ArgumentParser(prog="jaxrl dataset")
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("collect", help="generate a D4RL-style dataset from a policy run")
    c.add_argument("--env", default=None, help="Gymnasium env id (default: the policy's env)")
    c.add_argument("--policy", default=None, help="run directory of the behavior policy")
    c.add_argument("--policy-step", type=int, default=None, help="checkpoint step of --policy")
    c.add_argument("--kind", required=True, choices=KINDS)
    c.add_argument("--medium-policy", default=None, help="medium run directory (medium-expert)")
    c.add_argument("--expert-policy", default=None, help="run whose return is the reference max")
    c.add_argument("--steps", type=int, default=1_000_000, help="transitions to collect")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--ref-min-return", type=float, default=None)
    c.add_argument("--ref-max-return", type=float, default=None)
    c.add_argument("--out", required=True, help="output .hdf5 path")
    i = sub.add_parser("info", help="size, episodes, returns and reference scores of a dataset")
    i.add_argument("dataset", help="a .hdf5 file, a Minari dataset directory, or minari:ID")
    i.add_argument("--env", default=None, help="env id when the file does not name one (scores)")
    a = p.parse_args(argv)
    if a.action == "info":
        print(json.dumps(load_dataset(a.dataset, a.env).info(), indent=2, default=str))
        return
    ds = collect(
        a.env,
        a.kind,
        a.steps,
        a.seed,
        policy=a.policy,
        policy_step=a.policy_step,
        medium_policy=a.medium_policy,
        expert_policy=a.expert_policy,
        ref_min_return=a.ref_min_return,
        ref_max_return=a.ref_max_return,
    )
    path = save_d4rl(ds, a.out)
    info = ds.info()
    print(
        f"wrote {path}: {info['transitions']} transitions, {info['episodes']} episodes, return "
        f"{info['return_mean']:.1f} +/- {info['return_std']:.1f}, normalized "
        f"{info['normalized_score_mean']:.1f} (refs {info['ref_min_return']:.1f} .. "
        f"{info['ref_max_return']:.1f})"
    )


def _guard(fn: Any) -> Any:
    """Run ``fn``, turning the errors a user can cause into a one-line message and exit code 2."""
    from jaxrl.checkpoint import CheckpointError

    try:
        return fn()
    except (ValueError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
