"""Everything before the offline loop, shared by ``jaxrl train --dataset`` and the scripts."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from jaxrl.offline.common import prepare_offline
from jaxrl.offline.datasets import Dataset, load_dataset


@dataclasses.dataclass
class OfflineSetup:
    """A dataset matched to its env and an agent ready for ``train_offline``.

    Attributes:
        agent: the created agent with its dataset statistics (``norm``) set.
        data: the dataset as a device buffer (actions in ``[-1, 1]``).
        eval_env: evaluation env (``eval_episodes`` copies; Gymnasium or JAX).
        dataset: the loaded dataset (scores: ``dataset.normalized_score``).
        train_config: the loop config with ``env`` resolved.
        agent_config: the agent config (``max_steps`` resolved to ``total_steps`` when unset).
    """

    agent: Any
    data: Any
    eval_env: Any
    dataset: Dataset
    train_config: Any
    agent_config: Any

    def run_config_extras(self) -> dict[str, Any]:
        """What ``config.json`` records about the dataset (``jaxrl eval`` scores with it)."""
        return {
            "source": self.dataset.source,
            "env_id": self.dataset.env_id,
            "transitions": len(self.dataset),
            "ref_returns": self.dataset.ref_returns,
        }


def setup_offline(
    agent_cls: Any, agent_config: Any, train_config: Any, out: str | None = None
) -> OfflineSetup:
    """Load ``train_config.dataset``, build the eval env, validate, create and prepare the agent.

    The env is ``train_config.env`` or, when that is empty, the dataset's own env id. The
    dataset must match the env's observation and action sizes and action bounds. An unset
    ``max_steps`` (a learning-rate schedule's horizon) becomes the run's gradient steps (offline
    steps, plus online steps x ``utd_ratio`` for an offline-to-online run); when
    ``out`` already holds the run, its recorded horizon is kept, so extending the budget of a
    finished run resumes it instead of changing its schedule.

    Raises:
        ValueError: (``DatasetError`` / ``EnvError``) naming the mismatch and the fix.
    """
    from jaxrl.envs import make_env
    from jaxrl.envs.jax_envs import is_jax_env

    # --env names the dataset's env too (scores use its D4RL references if the file has none).
    dataset = load_dataset(train_config.dataset, train_config.env or None)
    env_id = dataset.env_id
    if not env_id:
        raise ValueError(
            f"{train_config.dataset} does not say which env it comes from (no metadata/env_id); "
            "pass --env."
        )
    train_config = dataclasses.replace(train_config, env=env_id)
    names = {f.name for f in dataclasses.fields(agent_config)}
    if "max_steps" in names and agent_config.max_steps is None:
        # Offline steps plus, for an offline-to-online run, the online phase's updates.
        offline = train_config.offline_steps
        online = (train_config.online_steps or 0) * getattr(agent_config, "utd_ratio", 1)
        total = (train_config.total_steps if offline is None else offline) + online
        horizon = _recorded(out, "max_steps") or total
        agent_config = dataclasses.replace(agent_config, max_steps=horizon)
    episodes = train_config.eval_episodes
    if is_jax_env(env_id):
        from jaxrl.runs import make_jax_envs

        _, eval_env = make_jax_envs(env_id, 1, episodes, agent_config)
        obs_dim, act_dim = eval_env.observation_size, eval_env.action_size
        low, high = -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32)
    else:
        eval_env = make_env(env_id, episodes)
        obs_dim, low, high = eval_env.obs_dim, eval_env.action_low, eval_env.action_high
    dataset.validate_for_env(obs_dim, low, high, env_id)
    obs = np.zeros(obs_dim, np.float32)
    act = np.zeros(dataset.action_dim, np.float32)
    agent = agent_cls.create(agent_config, obs, act, train_config.seed)
    agent, data = prepare_offline(agent, dataset, low, high)
    return OfflineSetup(agent, data, eval_env, dataset, train_config, agent_config)


def _recorded(out: str | None, field: str) -> Any:
    """``agent_config[field]`` of the run already in ``out`` (None without one)."""
    path = os.path.join(out, "config.json") if out else ""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("agent_config", {}).get(field)
