"""Run directories as objects: what a run's checkpoints hold, and restoring a trained agent.

``load_run("runs/sac-Hopper-v5-s0")`` gives back the agent of the newest (or a chosen)
checkpoint together with the run's config, for evaluation, dataset collection or fine-tuning.
Everything is decided by the agent's registry entry (``jaxrl.registry``) and the checkpoint's
``phase``; nothing here probes an agent for what it can do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import closing
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrl.errors import CheckpointError, ConfigError
from jaxrl.registry import AgentSpec


def env_obs_norm(spec: AgentSpec, agent_cfg: Any) -> bool:
    """True when the envs get a running-statistics observation wrapper (PPO's option).

    An offline agent's ``normalize_observations`` means dataset statistics applied inside the
    agent (``DataNorm``); its envs then give raw observations.
    """
    return spec.env_obs_norm and bool(agent_cfg.normalize_observations)


def jax_num_envs(spec: AgentSpec, num_envs: int | None) -> int:
    """``--num-envs`` on a JAX env: as given, else 64 (1 for planners, which plan per env)."""
    return num_envs or (1 if spec.kind == "planner" else 64)


def make_jax_envs(
    env_id: str, num_envs: int, eval_episodes: int, agent_cfg: Any, spec: AgentSpec
) -> tuple:
    """Training and evaluation JAX envs; both normalize observations when ``env_obs_norm``."""
    from jaxrl.envs.jax_envs import make_jax_env

    norm = env_obs_norm(spec, agent_cfg)
    env = make_jax_env(env_id, num_envs, normalize_obs=norm)
    eval_env = make_jax_env(env_id, eval_episodes, normalize_obs=norm)
    if norm:
        eval_env.update = False  # evaluation uses the training statistics, frozen
    return env, eval_env


def read_config(run_dir: str) -> dict[str, Any]:
    """``config.json`` of ``run_dir``.

    Raises:
        ValueError: ``run_dir`` is not a jaxrl run directory.
    """
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"{run_dir} is not a jaxrl run directory (no config.json).")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{path} is not readable JSON ({err}); the run's config is damaged. Restore it from "
            "a copy (the checkpoints beside it are untouched), or train into a new --out."
        ) from None
    if config.get("model") == "true_simulator":  # a `jaxrl plan` run (load_run says so)
        return config
    missing = [k for k in _CONFIG_KEYS if not isinstance(config, dict) or k not in config]
    if missing:
        raise ConfigError(
            f"{path} lacks {', '.join(missing)}: it was not written by `jaxrl train`. Restore "
            "the run's own config.json, or train into a new --out."
        )
    return config


_CONFIG_KEYS = ("agent", "env", "seed", "train", "agent_config")
"""What every ``config.json`` of a training run records (``jaxrl.loops.run_config``)."""


def online_updates(train_cfg: Any, agent_cfg: Any) -> int:
    """Gradient steps of the online phase: env steps / envs x updates per vectorized step."""
    num_envs = train_cfg.num_envs or 1
    per_step = train_cfg.updates_per_step or agent_cfg.utd_ratio * num_envs
    return max(1, (train_cfg.online_steps or train_cfg.total_steps) // num_envs * per_step)


def online_config(spec: AgentSpec, agent_cfg: Any, train_cfg: Any) -> Any:
    """The agent config of an offline agent's online phase.

    The offline phase's learning-rate schedule (``spec.horizon_field``) ends with that phase.
    Online, ``train_cfg.online_lr_schedule`` decides: 'constant' (horizon 0: no decay, every
    network at its base rate) or 'cosine' (a new decay over the online updates). Agents without
    a schedule keep their config, and so do on-policy agents: their schedule is the pretraining's
    (``dataset_pretrain``), and their online updates have rates of their own.
    """
    if spec.horizon_field is None or spec.kind == "on-policy":
        return agent_cfg
    if train_cfg.online_lr_schedule == "constant":
        horizon = 0
    else:
        horizon = online_updates(train_cfg, agent_cfg)
    return dataclasses.replace(agent_cfg, **{spec.horizon_field: horizon})


def _is_schedule(x: Any) -> bool:
    return isinstance(x, optax.ScaleByScheduleState)


def _optimizer_setting(path: tuple, leaf: Any) -> bool:
    """A schedule's counter, or a hyperparameter ``optax.inject_hyperparams`` keeps in the state.

    A scheduled optimizer injects only the learning rate; a constant one also Adam's ``b1``,
    ``b2``, ... (the same values), so the two states differ there and nowhere else.
    """
    key = jax.tree_util.GetAttrKey("hyperparams")
    return _is_schedule(leaf) or key in path


def carry_over(new: Any, old: Any) -> Any:
    """``new`` (an agent of the online config) with every leaf of ``old`` (the pretrained one).

    Parameters, optimizer moments and step counts, injected learning rates, target networks,
    data statistics and RNG come from ``old``. Learning-rate schedule counters come from ``new``,
    so a new schedule starts at the switch (a constant rate has none), and so do hyperparameters
    only one of the two optimizers injects. Leaves are matched by their path in the tree.

    Raises:
        ValueError: any other leaf has no counterpart of the same shape in the other agent (they
            are not the same agent up to its learning-rate schedule).
    """
    flat_old, _ = jax.tree_util.tree_flatten_with_path(old, is_leaf=_is_schedule)
    flat_new, treedef = jax.tree_util.tree_flatten_with_path(new, is_leaf=_is_schedule)
    by_path = {path: leaf for path, leaf in flat_old if not _is_schedule(leaf)}
    leaves, used = [], set()
    for path, leaf in flat_new:
        if _is_schedule(leaf) or (path not in by_path and _optimizer_setting(path, leaf)):
            leaves.append(leaf)
            continue
        if path not in by_path or jnp.shape(by_path[path]) != jnp.shape(leaf):
            raise ValueError(f"Cannot continue the agent online: {jax.tree_util.keystr(path)}.")
        leaves.append(by_path[path])
        used.add(path)
    unused = [p for p in set(by_path) - used if not _optimizer_setting(p, by_path[p])]
    if unused:
        names = ", ".join(sorted(jax.tree_util.keystr(p) for p in unused))
        raise ValueError(f"Cannot continue the agent online: no place for {names}.")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def online_agent(
    spec: AgentSpec, agent: Any, agent_cfg: Any, train_cfg: Any, obs: Any, act: Any
) -> Any:
    """``agent`` (pretrained offline) as the online phase's agent (``online_config``).

    Args:
        spec: the agent's registry entry.
        agent: the agent at the end of the offline phase (or a fresh one, as a template).
        agent_cfg: its (offline) config.
        train_cfg: the run's loop config (``online_lr_schedule``, ``online_steps``).
        obs: an observation example (for ``create``).
        act: an action example.
    """
    cfg = online_config(spec, agent_cfg, train_cfg)
    if cfg == agent_cfg:
        return agent
    fresh = spec.agent.create(cfg, obs, act, 0)
    if spec.dataset_rows:  # the dataset's rows, not create's placeholder (same shapes)
        fresh = fresh.replace(rows=agent.rows)
    return carry_over(fresh, agent)


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


@dataclasses.dataclass
class LoadedRun:
    """A restored run: its config, agent, full loop state and checkpoint metadata.

    Attributes:
        run_dir: the directory.
        config: ``config.json`` as a dict.
        agent_config: the agent's config object (of the checkpoint's phase).
        train_config: the loop's ``TrainConfig``.
        agent: the agent of the restored checkpoint.
        state: the restored loop state (``LoopState``, ``FusedState`` or ``OfflineState``).
        meta: the checkpoint's JSON record (``step``, ``phase``, ...).
        obs_stats: training observation statistics of JAX-env runs whose envs normalize
            (``env_obs_norm``), else None.
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

    The checkpoint's ``phase`` and the agent's kind say what it holds: an offline phase (or an
    offline agent's checkpoint without a phase) an ``OfflineState``, whatever the env; a run on a
    JAX env a ``FusedState``; otherwise a ``LoopState``, with an offline agent in its online
    configuration (``online_config``).

    Raises:
        ValueError: ``run_dir`` is not a jaxrl run directory, names an unknown agent or has no
            checkpoint.
    """
    from jaxrl import registry
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.loops import (
        OfflineState,
        TrainConfig,
        init_fused_state,
        init_loop_state,
        strongly_typed,
    )
    from jaxrl.loops.checkpoint import Checkpointer

    config = read_config(run_dir)
    if config.get("model") == "true_simulator":
        raise ConfigError(
            f"{run_dir} is a `jaxrl plan` run (planning with the true simulator): it holds no "
            "trained agent to evaluate; its episode returns are in summary.json; rerunning "
            "the same `jaxrl plan` command resumes it, and another --out plans new episodes."
        )
    if config["agent"] not in registry.names():
        raise ConfigError(
            f"{run_dir} was trained with unknown agent {config['agent']!r}: not one of this "
            f"jaxrl's agents ({', '.join(registry.names())}). Load it with the jaxrl version "
            "that wrote it."
        )
    spec = registry.get(config["agent"])
    agent_cfg = spec.make_config(**config["agent_config"])
    unknown = sorted(set(config["train"]) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ConfigError(
            f"{run_dir}/config.json has loop options this version of jaxrl does not know "
            f"({', '.join(unknown)}): the run was written by another version. Load it with that "
            "version, or retrain."
        )
    train_cfg = TrainConfig(**_tuples(config["train"]))
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    if ckpt.latest_step() is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet; train it first (jaxrl train ...).")
    if step is not None and step not in ckpt.all_steps():
        raise ConfigError(
            f"{run_dir} has no checkpoint at step {step}; its checkpoints are at steps "
            f"{ckpt.all_steps()} (omit the step for the newest)."
        )
    env_id, seed = config["env"], config["seed"]
    # Checkpoints without a phase (older runs) hold an offline agent's offline phase.
    phase = ckpt.meta(step).get("phase") or ("offline" if spec.offline else "online")
    obs, act = env_examples(env_id)
    agent = _with_recorded_rows(spec, spec.agent.create(agent_cfg, obs, act, seed), config)
    if phase == "online" and spec.offline:  # the online phase of an offline-to-online run
        agent = online_agent(spec, agent, agent_cfg, train_cfg, obs, act)
        agent_cfg = agent.config
    obs_stats = None
    if phase == "offline":
        template = OfflineState(agent, jax.random.key(0))
    elif is_jax_env(env_id):  # the fused loop's state
        num_envs = jax_num_envs(spec, train_cfg.num_envs)
        env, _ = make_jax_envs(env_id, num_envs, 1, agent_cfg, spec)
        template = init_fused_state(spec, agent_cfg, env, seed).replace(agent=agent)
    else:
        template = init_loop_state(spec, agent, _Dims(obs, act, train_cfg.num_envs or 1))
    state, meta = ckpt.restore(strongly_typed(template), step)
    if is_jax_env(env_id) and phase == "online":
        obs_stats = state.env.extras.get("obs_stats")
    return LoadedRun(run_dir, config, agent_cfg, train_cfg, state.agent, state, meta, obs_stats)


def env_examples(env_id: str) -> tuple[Any, Any]:
    """An observation and an action of ``env_id`` (zeros), from one copy of the env."""
    from jaxrl.envs.jax_envs import is_jax_env, make_jax_env

    if is_jax_env(env_id):
        dims = make_jax_env(env_id, 1)
        obs = jnp.zeros(dims.observation_size, jnp.float32)
        return obs, jnp.zeros(dims.action_size, jnp.float32)
    from jaxrl.envs import make_env

    with closing(make_env(env_id, 1)) as env:
        return env.obs_example, env.action_example


def env_sizes(env_id: str) -> tuple[int, int]:
    """``(observation size, action size)`` of ``env_id``."""
    obs, act = env_examples(env_id)
    return int(obs.shape[-1]), int(act.shape[-1])


def _with_recorded_rows(spec: AgentSpec, agent: Any, run_config: dict[str, Any]) -> Any:
    """``agent`` (fresh) shaped like the run's checkpoints: a template to restore them into.

    A ``spec.dataset_rows`` agent's checkpoints hold the dataset's rows, whose number
    ``config.json`` records (``dataset_info.transitions``); the template gets that many zero
    rows, which the restore overwrites. Other agents are returned unchanged.
    """
    if not spec.dataset_rows:
        return agent
    from jaxrl.offline.common import DatasetRows

    info = run_config.get("dataset_info") or {}
    if "transitions" not in info:
        raise CheckpointError(
            f"{spec.name} keeps its dataset's rows in its checkpoints, but config.json records "
            "no dataset_info.transitions to size them; load the run with the jaxrl version "
            "that wrote it."
        )
    obs_dim, act_dim = agent.rows.obs.shape[-1], agent.rows.action.shape[-1]
    return agent.replace(rows=DatasetRows.zeros(int(info["transitions"]), obs_dim, act_dim))


@dataclasses.dataclass
class _Dims:
    """Just what ``init_loop_state`` reads from an env: examples and the number of copies."""

    obs_example: Any
    action_example: Any
    num_envs: int


__all__ = [
    "LoadedRun",
    "env_examples",
    "env_sizes",
    "jax_num_envs",
    "carry_over",
    "env_obs_norm",
    "load_run",
    "make_jax_envs",
    "online_agent",
    "online_config",
    "online_updates",
    "read_config",
]
