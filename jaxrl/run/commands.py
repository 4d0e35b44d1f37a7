"""The run-level commands besides training: ``jaxrl eval`` (``jaxrl dataset`` is in ``collect``).

``jaxrl.cli.eval`` parses the command line and calls these; these functions are also the library
form of the commands (``evaluate_run(DIR)`` returns what ``jaxrl eval DIR`` prints).
"""

from __future__ import annotations

import os
from contextlib import closing
from typing import Any

from jaxrl.errors import ConfigError


def evaluate_run(
    run_dir: str,
    episodes: int | None = None,
    env: str | None = None,
    step: int | None = None,
    video: str | bool | None = None,
    size: tuple[int, int] = (320, 240),
    fps: float | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint of ``run_dir`` and evaluate its deterministic policy.

    ``env`` evaluates it on another env with the same observation and action sizes as the
    one it trained on (default: that one): the "real" system of a sim-to-real experiment, or a
    perturbed simulator (``jax:pendulum?m=1.3``). The result names the env. ``step`` picks a
    checkpoint (default: the newest). ``video`` (an mp4 path, or True for
    ``DIR/videos/eval_step_<step>.mp4``) also renders the evaluation episodes there, one after
    the other, at ``size`` (width, height) and ``fps`` (default: real time); rendering is
    checked to work before anything is evaluated.
    """
    from jaxrl import registry
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.loops.acting import acting
    from jaxrl.loops.evaluation import evaluate, evaluate_jax, record_jax
    from jaxrl.run.runs import load_run, make_jax_envs

    if episodes is not None and episodes < 1:
        raise ConfigError(f"--episodes must be at least 1, got {episodes}.")
    run = load_run(run_dir, step)
    episodes = episodes or run.train_config.eval_episodes
    env_id = env or run.config["env"]
    if env:
        _check_same_spaces(run, env)
    if video:
        from jaxrl.loops.video import check_rendering

        check_rendering(env_id)
    seed = run.train_config.seed + 20_000
    spec = registry.get(run.config["agent"])
    policy = acting(spec)
    if is_jax_env(env_id):
        import jax

        _, eval_env = make_jax_envs(env_id, 1, episodes, run.agent_config, spec)
        # With a video, the evaluation keeps the frames' data: one compiled rollout for both.
        evaluation = record_jax if video else evaluate_jax
        key = jax.random.key(seed)
        out = jax.jit(lambda a, s: evaluation(a, eval_env, key, s, policy))(
            run.agent, run.obs_stats
        )
        returns = out[0] if video else out
    else:
        eval_env = env_id
        with closing(make_env(env_id, episodes)) as env:
            returns = evaluate(run.agent, env, seed, policy=policy)
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
    if video:
        from jaxrl.loops.video import episode_frames, write_video

        recorded = None if isinstance(eval_env, str) else (lambda *_: out)
        frames, rate = episode_frames(
            run.agent, eval_env, seed, size, episodes, run.obs_stats, policy, recorded
        )
        if video is True:
            video = os.path.join(run_dir, "videos", f"eval_step_{result['step']}.mp4")
        result["video"] = write_video(video, frames, fps or rate)
    return result


def _check_same_spaces(run: Any, env_id: str) -> None:
    """Refuse an evaluation env whose observation or action size differs from the run's."""
    from jaxrl.run.runs import env_sizes

    trained, other = env_sizes(run.config["env"]), env_sizes(env_id)
    if trained != other:
        raise ConfigError(
            f"--env {env_id!r} has (observation, action) sizes {other}, but {run.run_dir} was "
            f"trained on {run.config['env']!r} with {trained}; evaluate on an env with the same "
            "spaces."
        )


def dataset_score(config: dict[str, Any], ret: float) -> float | None:
    """Normalized score of ``ret`` with the references recorded when the run was trained."""
    from jaxrl.data import normalized_score, reference_returns

    refs = (config.get("dataset_info") or {}).get("ref_returns")
    return normalized_score(ret, tuple(refs) if refs else reference_returns(config["env"]))


__all__ = ["dataset_score", "evaluate_run"]
