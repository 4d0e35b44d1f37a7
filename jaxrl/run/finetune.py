"""Training with a dataset and an environment: offline-to-online fine-tuning and RLPD.

Both run the shared loops: ``train_offline`` for the offline phase, then the online phase with
the dataset mixed into every minibatch (``--offline-ratio``): ``train_host`` on Gymnasium envs,
``train_fused`` on JAX envs (the dataset is then a second device buffer inside the compiled
chunk). Nothing here
depends on the agent's name: an offline agent's pretrained state (networks, optimizer states,
data statistics) is the online phase's starting agent, and an online agent (RLPD = SAC with
RLPD's configuration) simply has no offline phase.

A learning-rate schedule (IQL, IDQL, Diffusion-QL: the registry's ``horizon_field``) spans the
offline phase only. The online phase trains every network at its base rate by default, or with
a new cosine decay over its updates (``--online-lr-schedule cosine``); see
``jaxrl.run.runs.online_config``.

One run directory holds both phases: ``metrics.csv`` rows are numbered by gradient steps during
the offline phase and ``offline steps + env steps`` afterwards (with an ``env_step`` column), and
checkpoints record their ``phase`` so that resuming, ``jaxrl eval`` and ``jaxrl finetune`` know
which state they hold.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import closing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.envs.jax_envs import is_jax_env
from jaxrl.errors import ConfigError
from jaxrl.loops import (
    OfflineState,
    TrainConfig,
    default_out,
    prepare_run_dir,
    run_config,
    strongly_typed,
    train_fused,
    train_host,
    train_offline,
)
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.evaluation import close_envs
from jaxrl.registry import AgentSpec
from jaxrl.run.offline import OfflineSetup, setup_offline
from jaxrl.run.runs import jax_num_envs, make_jax_envs, online_agent, read_config


def check_fused_data(spec: AgentSpec, agent_config: Any) -> None:
    """Refuse, before any training, what the fused loop cannot give an agent with a dataset."""
    if spec.needs_next_action or spec.needs_mc_return:
        raise ConfigError(
            f"{spec.name}'s online rows need the next action or the return-to-go, which only "
            "the host loop fills in; fine-tune it on the Gymnasium version of the task (e.g. "
            "Pendulum-v1 for jax:pendulum), or train it offline only (drop --online-steps)."
        )
    if spec.sequence_length(agent_config) or spec.refit_every(agent_config):
        raise ConfigError(
            f"{spec.name} learns from runs of consecutive steps or refits on its whole buffer; "
            "the fused loop mixes a dataset into single-row minibatches only. Train it without "
            "--dataset."
        )


def _check_on_policy_phase(spec: AgentSpec, cfg: TrainConfig) -> None:
    """Refuse what an on-policy agent's online phase (``dataset_pretrain``) cannot do."""
    if not is_jax_env(cfg.env):
        raise ConfigError(
            f"{spec.name} is fine-tuned on its own rollouts in the fused loop, on a JAX env; "
            f"{cfg.env!r} is not one. Collect the dataset on a JAX env (jaxrl dataset collect "
            "--env jax:NAME), or train offline only (drop --online-steps)."
        )
    if cfg.online_lr_schedule != "constant":
        raise ConfigError(
            f"--online-lr-schedule {cfg.online_lr_schedule} sets an offline agent's online "
            f"learning rates; {spec.name}'s online updates have rates of their own (its "
            "config's). Drop the option."
        )


def start_run(spec: AgentSpec, agent_cfg: Any, cfg: TrainConfig, out: str) -> OfflineSetup:
    """Load the dataset, create the agent and write ``config.json`` (see ``setup_offline``).

    Raises:
        ValueError: a dataset/env mismatch, or an on-policy agent on a Gymnasium env.
    """
    s = setup_offline(spec, agent_cfg, cfg, out)
    try:
        if is_jax_env(s.train_config.env):  # the online phase is the fused loop
            check_fused_data(spec, s.agent_config)
        if spec.kind == "on-policy":
            _check_on_policy_phase(spec, s.train_config)
        config = run_config(spec.name, s.agent_config, s.train_config)
        prepare_run_dir(out, {**config, "dataset_info": s.run_config_extras()})
    except BaseException:
        close_envs(s.eval_env)
        raise
    return s


def train_online(s: OfflineSetup, agent: Any, out: str, offline_steps: int = 0) -> dict[str, Any]:
    """The online phase with the dataset in every minibatch: the host or the fused loop.

    Gymnasium envs train in the host loop, JAX envs in the fused loop. Its envs and the setup's
    eval env are closed when it returns or raises.

    It runs ``--online-steps`` (default ``--total-steps``) env steps; ``--offline-ratio`` of
    each minibatch comes from the dataset. An offline agent continues in its online
    configuration (``jaxrl.run.runs.online_agent``: its learning-rate schedule restarts).

    Args:
        s: the setup (dataset, eval env, loop config) from ``setup_offline``.
        agent: the agent to train: fresh (RLPD) or pretrained (``pretrain``).
        out: the run directory.
        offline_steps: gradient steps of the offline phase before (numbering of rows).
    """
    from jaxrl.envs import make_env

    cfg = s.train_config
    cfg = dataclasses.replace(cfg, total_steps=cfg.online_steps or cfg.total_steps)
    obs = np.zeros(s.dataset.obs_dim, np.float32)
    act = np.zeros(s.dataset.action_dim, np.float32)
    # On-policy agents learn from their own rollouts online: the data served their pretraining.
    mixes = cfg.offline_ratio > 0 and s.spec.kind != "on-policy"
    prior = s.data if mixes else None
    mix = {"prior": prior, "prior_ratio": cfg.offline_ratio, "step_offset": offline_steps}
    score = s.dataset.normalized_score
    try:
        agent = online_agent(s.spec, agent, s.agent_config, cfg, obs, act)
        if is_jax_env(cfg.env):  # --num-envs unset stays unset in config.json (load_run too)
            cfg = dataclasses.replace(cfg, num_envs=jax_num_envs(s.spec, cfg.num_envs))
            env, _ = make_jax_envs(cfg.env, cfg.num_envs, 1, agent.config, s.spec)
            agents = strongly_typed(jax.tree.map(lambda x: jnp.asarray(x)[None], agent))
            return train_fused(
                s.spec, agent.config, env, s.eval_env, cfg, [out], agents=agents, score_fn=score,
                **mix,
            )[0]  # fmt: skip
        with closing(make_env(cfg.env, cfg.num_envs or 1)) as env:
            return train_host(s.spec, agent, env, s.eval_env, cfg, out, score_fn=score, **mix)
    finally:
        close_envs(s.eval_env)


def train_with_data(spec: AgentSpec, agent_cfg: Any, cfg: TrainConfig) -> dict:
    """An online agent trained on an env with a dataset in every minibatch (RLPD).

    ``--online-steps`` (default ``--total-steps``) env steps; there is no offline phase.

    Raises:
        ValueError: for ``--offline-steps > 0``.
    """
    if cfg.offline_steps:
        offline = ", ".join(registry.names("offline"))
        raise ConfigError(
            f"{spec.name} is an online agent: it has no offline phase, so --offline-steps "
            f"{cfg.offline_steps} does nothing. Drop it, or pretrain an offline agent ({offline})"
            " with --offline-steps N --online-steps M."
        )
    out = cfg.out or default_out(spec.name, cfg)
    s = start_run(spec, agent_cfg, cfg, out)
    return train_online(s, s.agent, out)


def train_offline_to_online(spec: AgentSpec, agent_cfg: Any, cfg: TrainConfig) -> dict[str, Any]:
    """Pretrain an offline agent on ``--dataset``, then fine-tune it online.

    The offline phase runs ``--offline-steps`` (default ``--total-steps``) gradient steps, the
    online phase ``--online-steps`` env steps.
    The online phase starts from the offline phase's final checkpoint, so the switch keeps the
    optimizer states; ``--offline-ratio`` keeps the dataset in the sampling mix (0 drops it), and
    ``--online-lr-schedule`` sets the online learning rates (default: constant).
    Resumes whichever phase the run directory's newest checkpoint belongs to.
    """
    out = cfg.out or default_out(spec.name, cfg)
    s = start_run(spec, agent_cfg, cfg, out)
    try:
        agent, offline_steps = pretrain(s, out)
        if agent is None:  # interrupted; the checkpoint is saved and a rerun resumes
            return {"completed": False}
        return train_online(s, agent, out, offline_steps)
    finally:
        close_envs(s.eval_env)  # closing twice (train_online closes it) does nothing


def pretrain(s: OfflineSetup, out: str) -> tuple[Any, int]:
    """The offline phase: ``train_offline`` for ``--offline-steps`` (default ``--total-steps``).

    Returns the agent of the phase's final checkpoint (networks, optimizer states and data
    statistics: what the online phase continues from) and the number of offline steps. When
    the run directory is already in its online phase, the agent is ``s.agent`` unchanged (the
    online loop restores its own checkpoint); when the phase was interrupted, it is None.
    """
    cfg = s.train_config
    offline_steps = cfg.total_steps if cfg.offline_steps is None else cfg.offline_steps
    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    latest = ckpt.latest_step()
    if offline_steps == 0 or (latest is not None and ckpt.meta(latest).get("phase") == "online"):
        return s.agent, offline_steps
    offline_cfg = dataclasses.replace(cfg, total_steps=offline_steps)
    score = s.dataset.normalized_score
    train_offline(s.spec, s.agent, s.data, s.eval_env, offline_cfg, out, score_fn=score)
    if ckpt.latest_step() != offline_steps:
        return None, offline_steps
    template = strongly_typed(OfflineState(s.agent, jax.random.key(0)))
    return ckpt.restore(template, offline_steps)[0].agent, offline_steps


def finetune_run(
    run_dir: str,
    online_steps: int,
    offline_ratio: float | None = None,
    online_lr_schedule: str | None = None,
) -> dict:
    """Continue the offline run in ``run_dir`` online (``jaxrl finetune DIR``).

    Equivalent to having trained it with ``--online-steps online_steps``: the same directory
    gets the online phase. An unfinished offline phase is completed first.

    Args:
        run_dir: the offline run's directory.
        online_steps: env steps of the online phase.
        offline_ratio: dataset share of each online minibatch (default: the run's).
        online_lr_schedule: 'constant' or 'cosine' (default: the run's, i.e. 'constant').

    Raises:
        ValueError: ``run_dir`` is not an offline run directory.
    """
    config = read_config(run_dir)
    name = config["agent"]
    spec = registry.get(name)
    if not spec.offline or not config.get("dataset"):
        raise ConfigError(
            f"{run_dir} is a run of {name} without a dataset; `jaxrl finetune` continues an "
            f"offline run (jaxrl train {'|'.join(registry.names('offline'))} --dataset D)."
        )
    changes: dict[str, Any] = {"online_steps": online_steps, "out": run_dir}
    if offline_ratio is not None:
        changes["offline_ratio"] = offline_ratio
    if online_lr_schedule is not None:
        changes["online_lr_schedule"] = online_lr_schedule
    train = {k: tuple(v) if isinstance(v, list) else v for k, v in config["train"].items()}
    cfg = dataclasses.replace(TrainConfig(**train), env=config["env"], **changes)
    return train_offline_to_online(spec, spec.make_config(**config["agent_config"]), cfg)


__all__ = [
    "finetune_run",
    "pretrain",
    "start_run",
    "train_offline_to_online",
    "train_online",
    "train_with_data",
]
