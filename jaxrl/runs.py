"""Run directories as objects: the agent registry and restoring a trained agent from a run.

``load_run("runs/sac-Hopper-v5-s0")`` gives back the agent of the newest (or a chosen)
checkpoint together with the run's config, for evaluation, dataset collection or fine-tuning.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax


def agent_registry() -> dict[str, tuple[type, type]]:
    """Command-line name -> (agent class, config class) for every online and offline agent."""
    from jaxrl.agents import AGENTS
    from jaxrl.offline import OFFLINE_AGENTS

    return {**AGENTS, **OFFLINE_AGENTS}


def make_jax_envs(env_id: str, num_envs: int, eval_episodes: int, agent_cfg: Any) -> tuple:
    """Training and evaluation JAX envs; both normalize observations if the agent asks for it."""
    from jaxrl.envs.jax_envs import make_jax_env

    norm = bool(getattr(agent_cfg, "normalize_observations", False))
    env = make_jax_env(env_id, num_envs, normalize_obs=norm)
    eval_env = make_jax_env(env_id, eval_episodes, normalize_obs=norm)
    if norm:
        eval_env.update = False  # evaluation uses the training statistics, frozen
    return env, eval_env


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


@dataclasses.dataclass
class LoadedRun:
    """A restored run: its config, agent, full loop state and checkpoint metadata.

    Attributes:
        run_dir: the directory.
        config: ``config.json`` as a dict.
        agent_config: the agent's config object.
        train_config: the loop's ``TrainConfig``.
        agent: the agent of the restored checkpoint.
        state: the restored loop state (``LoopState``, ``FusedState`` or ``OfflineState``).
        meta: the checkpoint's JSON record (``step``, ...).
        obs_stats: training observation statistics of JAX-env runs that normalize (else None).
    """

    run_dir: str
    config: dict[str, Any]
    agent_config: Any
    train_config: Any
    agent: Any
    state: Any
    meta: dict[str, Any]
    obs_stats: Any = None


def load_run(run_dir: str, step: int | None = None) -> LoadedRun:
    """Restore the checkpoint at ``step`` (default: the newest) of ``run_dir``.

    Raises:
        ValueError: ``run_dir`` is not a jaxrl run directory or has no checkpoint.
    """
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.training import (
        OfflineState,
        TrainConfig,
        init_fused_state,
        init_loop_state,
        strongly_typed,
    )

    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir} is not a jaxrl run directory (no config.json).")
    with open(path) as f:
        config = json.load(f)
    registry = agent_registry()
    if config["agent"] not in registry:
        raise ValueError(f"{run_dir} was trained with unknown agent {config['agent']!r}.")
    agent_cls, config_cls = registry[config["agent"]]
    agent_cfg = config_cls(**_tuples(config["agent_config"]))
    train_cfg = TrainConfig(**_tuples(config["train"]))
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    if ckpt.latest_step() is None:
        raise ValueError(f"{run_dir} has no checkpoint yet; train it first (jaxrl train ...).")
    env_id, seed = config["env"], config["seed"]
    obs_stats = None
    if is_jax_env(env_id):
        env, _ = make_jax_envs(env_id, train_cfg.num_envs or 64, 1, agent_cfg)
        template = init_fused_state(agent_cls, agent_cfg, env, seed)
        state, meta = ckpt.restore(template, step)
        obs_stats = state.env.extras.get("obs_stats")
    else:
        from jaxrl.envs import make_env

        env = make_env(env_id, 1)
        obs, act = env.obs_example, env.action_example
        env.close()
        agent = agent_cls.create(agent_cfg, obs, act, seed)
        # Offline runs checkpoint an OfflineState; the online phase of a run with a dataset
        # (fine-tuning, RLPD) a LoopState. Checkpoints say which ("phase") since fine-tuning.
        phase = ckpt.meta(step).get("phase")
        if phase == "offline" or (phase is None and config.get("dataset")):
            template = OfflineState(agent, jax.random.key(0))
        else:
            template = init_loop_state(agent, _Dims(obs, act), seed)
        template = strongly_typed(template)
        state, meta = ckpt.restore(template, step)
    return LoadedRun(run_dir, config, agent_cfg, train_cfg, state.agent, state, meta, obs_stats)


@dataclasses.dataclass
class _Dims:
    """Just the examples ``init_loop_state`` reads from an env."""

    obs_example: Any
    action_example: Any
