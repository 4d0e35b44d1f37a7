"""The run-level commands besides training: ``jaxrl eval`` and ``jaxrl dataset``.

``jaxrl.cli.app`` parses the command line and dispatches here; these functions are also the library
form of the commands (``evaluate_run(DIR)`` returns what ``jaxrl eval DIR`` prints).
"""

from __future__ import annotations

import json
from typing import Any

from jaxrl.errors import ConfigError


def evaluate_run(run_dir: str, episodes: int | None = None) -> dict[str, Any]:
    """Restore the newest checkpoint of ``run_dir`` and evaluate its deterministic policy."""
    from jaxrl import registry
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.loops.acting import acting
    from jaxrl.loops.evaluation import evaluate, evaluate_jax
    from jaxrl.run.runs import load_run, make_jax_envs

    if episodes is not None and episodes < 1:
        raise ConfigError(f"--episodes must be at least 1, got {episodes}.")
    run = load_run(run_dir)
    episodes = episodes or run.train_config.eval_episodes
    env_id = run.config["env"]
    seed = run.train_config.seed + 20_000
    spec = registry.get(run.config["agent"])
    policy = acting(spec)
    if is_jax_env(env_id):
        import jax

        _, eval_env = make_jax_envs(env_id, 1, episodes, run.agent_config, spec)
        fn = jax.jit(lambda a, s: evaluate_jax(a, eval_env, jax.random.key(seed), s, policy))
        returns = fn(run.agent, run.obs_stats)
    else:
        env = make_env(env_id, episodes)
        returns = evaluate(run.agent, env, seed, policy=policy)
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
        result["normalized_score"] = dataset_score(run.config, result["return_mean"])
    return result


def dataset_score(config: dict[str, Any], ret: float) -> float | None:
    """Normalized score of ``ret`` with the references recorded when the run was trained."""
    from jaxrl.data import normalized_score, reference_returns

    refs = (config.get("dataset_info") or {}).get("ref_returns")
    return normalized_score(ret, tuple(refs) if refs else reference_returns(config["env"]))


def dataset_command(argv: list[str]) -> None:
    """``jaxrl dataset collect ...`` (write a D4RL-format file) and ``jaxrl dataset info FILE``."""
    import argparse

    from jaxrl.data import load_dataset, save_d4rl
    from jaxrl.run.collect import KINDS, collect

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


__all__ = ["dataset_command", "dataset_score", "evaluate_run"]
