"""The ``jaxrl`` command line: ``jaxrl train AGENT ...``, ``jaxrl eval DIR``, ``jaxrl plot``.

``jaxrl train AGENT --help`` lists every loop option and agent hyperparameter with its docstring.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Annotated, Any

USAGE = """usage: jaxrl {{train,eval,plot}} ...

  jaxrl train AGENT --env ENV [--total-steps N] [--seed S] [--num-envs E] [--out DIR]
                    [--eval-every N] [--eval-episodes N] [agent options...]
  jaxrl eval DIR [--episodes N]      print one JSON line with the evaluation return
  jaxrl plot DIR [DIR ...] [--out FILE]   plot eval return against steps

agents: {agents}
`jaxrl train AGENT --help` lists every option with its documentation.
"""


def _agents() -> dict[str, Any]:
    from jaxrl.agents import AGENTS

    return AGENTS


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
    return args.train, args.agent


def train(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    """Build envs and agent, then run the shared host or fused loop; returns the summary.

    With ``--num-seeds K > 1`` (JAX envs) each seed gets ``OUT/s<seed>`` and the returned summary
    (also ``OUT/summary.json``) aggregates them.
    """
    from jaxrl.envs.jax_envs import is_jax_env

    agent_cls, _ = _agents()[agent_name]
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
    from jaxrl.training import prepare_run_dir, run_config, train_host

    num_envs = train_cfg.num_envs or 1
    env = make_env(train_cfg.env, num_envs)
    eval_env = make_env(train_cfg.env, train_cfg.eval_episodes)
    out = train_cfg.out or _default_out(agent_name, train_cfg)
    prepare_run_dir(out, run_config(agent_name, agent_cfg, train_cfg))
    agent = agent_cls.create(agent_cfg, env.obs_example, env.action_example, train_cfg.seed)
    summary = train_host(agent, env, eval_env, train_cfg, out, agent_name)
    env.close()
    eval_env.close()
    return summary


def _default_out(agent_name: str, cfg: Any) -> str:
    seeds = f"s{cfg.seed}" if cfg.num_seeds == 1 else f"s{cfg.seed}-{cfg.seed + cfg.num_seeds - 1}"
    name = f"{agent_name}-{cfg.env.split('?')[0]}-{seeds}"
    return os.path.join("runs", name.replace(":", "_"))


def make_jax_envs(env_id: str, num_envs: int, eval_episodes: int, agent_cfg: Any) -> tuple:
    """Training and evaluation JAX envs; both normalize observations if the agent asks for it."""
    from jaxrl.envs.jax_envs import make_jax_env

    norm = bool(getattr(agent_cfg, "normalize_observations", False))
    env = make_jax_env(env_id, num_envs, normalize_obs=norm)
    eval_env = make_jax_env(env_id, eval_episodes, normalize_obs=norm)
    if norm:
        eval_env.update = False  # evaluation uses the training statistics, frozen
    return env, eval_env


def _train_jax(agent_name: str, train_cfg: Any, agent_cfg: Any) -> dict[str, Any]:
    import dataclasses as dc

    import numpy as np

    from jaxrl.logging import plot_learning_curves, write_json
    from jaxrl.training import prepare_run_dir, run_config, train_fused

    agent_cls, _ = _agents()[agent_name]
    num_envs = train_cfg.num_envs or 64
    train_cfg = dc.replace(train_cfg, num_envs=num_envs)
    env, eval_env = make_jax_envs(train_cfg.env, num_envs, train_cfg.eval_episodes, agent_cfg)
    out = train_cfg.out or _default_out(agent_name, train_cfg)
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
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.training import TrainConfig, evaluate, init_loop_state

    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise SystemExit(f"{run_dir} is not a jaxrl run directory (no config.json).")
    with open(path) as f:
        config = json.load(f)
    agent_cls, config_cls = _agents()[config["agent"]]
    agent_cfg = config_cls(**_tuples(config["agent_config"]))
    train_cfg = TrainConfig(**config["train"])
    episodes = episodes or train_cfg.eval_episodes
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    if is_jax_env(config["env"]):
        import jax

        from jaxrl.training import evaluate_jax, init_fused_state

        env, eval_env = make_jax_envs(config["env"], train_cfg.num_envs, episodes, agent_cfg)
        state, meta = ckpt.restore(init_fused_state(agent_cls, agent_cfg, env, config["seed"]))
        stats = state.env.extras.get("obs_stats")
        key = jax.random.key(train_cfg.seed + 20_000)
        returns = jax.jit(lambda a, s: evaluate_jax(a, eval_env, key, s))(state.agent, stats)
    else:
        env = make_env(config["env"], episodes)
        agent = agent_cls.create(agent_cfg, env.obs_example, env.action_example, config["seed"])
        state, meta = ckpt.restore(init_loop_state(agent, env, config["seed"]))
        returns = evaluate(state.agent, env, train_cfg.seed + 20_000)
        env.close()
    return {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "episodes": int(episodes),
        "step": int(meta["step"]),
        "agent": config["agent"],
        "env": config["env"],
    }


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


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
        if summary["completed"]:
            print(
                f"final eval return: {summary['final_eval_return_mean']:.2f} "
                f"+/- {summary['final_eval_return_std']:.2f} ({summary['env_steps_per_s']:.0f} "
                f"env steps/s)"
            )
    elif cmd == "eval":
        import argparse

        p = argparse.ArgumentParser(prog="jaxrl eval")
        p.add_argument("run_dir")
        p.add_argument("--episodes", type=int, default=None)
        a = p.parse_args(rest)
        print(json.dumps(_guard(lambda: evaluate_run(a.run_dir, a.episodes))))
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
