"""Everything before the offline loop, shared by ``jaxrl train --dataset`` and the scripts."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from jaxrl.buffers import BufferState
from jaxrl.data.dataset import Dataset
from jaxrl.data.loading import load_dataset
from jaxrl.errors import DatasetError
from jaxrl.offline.common import data_norm, dataset_rows
from jaxrl.registry import AgentSpec


@dataclasses.dataclass
class OfflineSetup:
    """A dataset matched to its env and an agent ready for ``train_offline``.

    Attributes:
        spec: the agent's registry entry.
        agent: the created agent with its dataset statistics (``norm``, and ``rows`` for
            ``dataset_rows`` agents) set.
        data: the dataset as a device buffer (actions in ``[-1, 1]``).
        eval_env: evaluation env (``eval_episodes`` copies; Gymnasium or JAX).
        dataset: the loaded dataset (scores: ``dataset.normalized_score``).
        train_config: the loop config with ``env`` resolved.
        agent_config: the agent config (its schedule horizon resolved when unset).
        action_low: the env's lower action bounds (the dataset's actions map to ``[-1, 1]``).
        action_high: the env's upper action bounds.
    """

    spec: AgentSpec
    agent: Any
    data: Any
    eval_env: Any
    dataset: Dataset
    train_config: Any
    agent_config: Any
    action_low: Any = -1.0
    action_high: Any = 1.0

    def run_config_extras(self) -> dict[str, Any]:
        """What ``config.json`` records about the dataset (``jaxrl eval`` scores with it)."""
        return {
            "source": self.dataset.source,
            "env_id": self.dataset.env_id,
            "transitions": len(self.dataset),
            "ref_returns": self.dataset.ref_returns,
        }


def setup_offline(
    spec: AgentSpec, agent_config: Any, train_config: Any, out: str | None = None
) -> OfflineSetup:
    """Load ``train_config.dataset``, build the eval env, validate, create and prepare the agent.

    The env is ``train_config.env`` or, when that is empty, the dataset's own env id. The
    dataset must match the env's observation and action sizes and action bounds. An unset
    learning-rate schedule horizon (``spec.horizon_field``) becomes the offline phase's gradient
    steps (the online phase has its own schedule, see ``jaxrl.run.runs.online_config``); when
    ``out`` already holds the run, its recorded horizon is kept, so extending the budget of a
    finished run resumes it instead of changing its schedule. The caller closes the setup's
    ``eval_env`` (``jaxrl.loops.evaluation.close_envs``, in a ``finally``).

    Args:
        spec: the agent's registry entry.
        agent_config: its config.
        train_config: the loop config (``dataset``, ``env``, steps, ``eval_episodes``, ``seed``).
        out: the run directory, when it may already hold the run.

    Raises:
        ValueError: (``DatasetError`` / ``EnvError``) naming the mismatch and the fix.
    """
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env
    from jaxrl.loops.evaluation import close_envs

    # --env names the dataset's env too (scores use its D4RL references if the file has none).
    dataset = load_dataset(train_config.dataset, train_config.env or None)
    env_id = dataset.env_id
    if not env_id:
        raise DatasetError(
            f"{train_config.dataset} does not say which env it comes from (no metadata/env_id); "
            "pass --env."
        )
    train_config = dataclasses.replace(train_config, env=env_id)
    field = spec.horizon_field
    if field is not None and getattr(agent_config, field) is None:
        offline = train_config.offline_steps
        steps = train_config.total_steps if offline is None else offline
        recorded = _recorded(out, field)
        horizon = max(steps, 1) if recorded is None else recorded
        agent_config = dataclasses.replace(agent_config, **{field: horizon})
    episodes = train_config.eval_episodes
    if is_jax_env(env_id):
        from jaxrl.run.runs import make_jax_envs

        _, eval_env = make_jax_envs(env_id, 1, episodes, agent_config, spec)
        obs_dim, act_dim = eval_env.observation_size, eval_env.action_size
        low, high = -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32)
    else:
        eval_env = make_env(env_id, episodes)
        obs_dim, low, high = eval_env.obs_dim, eval_env.action_low, eval_env.action_high
    try:
        dataset.validate_for_env(obs_dim, low, high, env_id)
        check_batch_fits(spec, agent_config, dataset)
        obs = np.zeros(obs_dim, np.float32)
        act = np.zeros(dataset.action_dim, np.float32)
        agent = spec.agent.create(agent_config, obs, act, train_config.seed)
        agent, data = prepare_offline(spec, agent, dataset, low, high)
    except BaseException:
        close_envs(eval_env)  # the caller closes it once it has the setup
        raise
    return OfflineSetup(spec, agent, data, eval_env, dataset, train_config, agent_config, low, high)


def check_batch_fits(spec: AgentSpec, agent_config: Any, dataset: Dataset) -> None:
    """Refuse an offline agent's minibatch larger than its whole dataset.

    Sampling would repeat rows in every minibatch, which is almost always a mistake (a tiny
    file, or the batch size of another setup).

    Raises:
        ConfigError: ``batch_size`` exceeds the number of transitions.
    """
    from jaxrl.config import ConfigError

    if not spec.offline:  # online agents with a dataset mix it in at their own ratio
        return
    batch = agent_config.batch_size  # every offline config has one (the offline loop reads it)
    if batch > len(dataset):
        raise ConfigError(
            f"{type(agent_config).__name__}.batch_size ({batch}) is larger than the dataset "
            f"{dataset.source} ({len(dataset)} transitions); set --batch-size to at most "
            f"{len(dataset)}, or use a larger dataset."
        )


def _recorded(out: str | None, field: str) -> Any:
    """``agent_config[field]`` of the run already in ``out`` (None without one)."""
    path = os.path.join(out, "config.json") if out else ""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("agent_config", {}).get(field)


def with_data_norm(
    spec: AgentSpec, agent: Any, dataset: Any, action_low: Any = -1.0, action_high: Any = 1.0
) -> Any:
    """``agent`` with what it keeps of the dataset set from ``dataset`` (others unchanged).

    ``spec.data_norm`` agents get the dataset's statistics (``norm``); ``spec.dataset_rows``
    agents then get its rows (``rows``): observations normalized with those statistics, actions
    mapped to ``[-1, 1]`` with the env's bounds ``action_low`` / ``action_high``.
    """
    if spec.data_norm:
        agent = agent.replace(norm=data_norm(dataset, agent.config))
    if spec.dataset_rows:
        agent = agent.replace(rows=dataset_rows(dataset, agent.norm, action_low, action_high))
    return agent


def prepare_offline(
    spec: AgentSpec, agent: Any, dataset: Any, action_low: Any = -1.0, action_high: Any = 1.0
) -> tuple[Any, BufferState]:
    """Set the agent's dataset statistics (and rows) and put the dataset in a device buffer.

    Args:
        spec: the agent's registry entry: ``data_norm`` agents get the dataset's statistics
            and ``dataset_rows`` agents its rows (``with_data_norm``; online agents trained on
            data, e.g. RLPD, are returned unchanged); the buffer
            carries ``next_action`` for ``needs_next_action`` (ReBRAC), ``mc_return`` for
            ``needs_mc_return`` (Cal-QL) and ``from_dataset`` for ``needs_source``.
        agent: the freshly created agent.
        dataset: the ``Dataset``.
        action_low: the env's lower action bounds (the buffer holds actions in ``[-1, 1]``).
        action_high: the env's upper action bounds.
    """
    agent = with_data_norm(spec, agent, dataset, action_low, action_high)
    discount = float(agent.config.discount) if spec.needs_mc_return else None
    rows = (spec.needs_next_action, discount, spec.needs_source)
    return agent, dataset.buffer(action_low, action_high, *rows)
