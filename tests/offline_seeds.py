"""Offline learning tests over several agent seeds: train them vmapped, evaluate each, average.

On Pendulum an episode either swings up (about -150) or does not (about -1,000), so one small
agent trained for a few thousand updates lands anywhere between -200 and -900 depending on its
seed (measured on the medium data for IQL, IDQL and FQL). The mean over ``AGENT_SEEDS`` agents,
trained as one vmapped program, is what the tests compare with their thresholds.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from offline_utils import eval_pendulum, learning_seed

from jaxrl.buffers import buffer_from_arrays, buffer_sample
from jaxrl.types import Transition

AGENT_SEEDS = 3


def agent_seeds() -> list[int]:
    """The agents' seeds: ``learning_seed()`` first, then steps of 1000."""
    return [learning_seed() + 1000 * i for i in range(AGENT_SEEDS)]


@partial(jax.jit, static_argnames=("num_updates", "batch_size"))
def _train(agents: Any, data: Any, keys: jax.Array, num_updates: int, batch_size: int) -> Any:
    def one(agent: Any, key: jax.Array) -> Any:
        def body(agent: Any, k: jax.Array) -> tuple[Any, dict]:
            return agent.update(buffer_sample(data, k, batch_size))

        return jax.lax.scan(body, agent, jax.random.split(key, num_updates))[0]

    return jax.vmap(one)(agents, keys)


def train_and_evaluate(
    create: Callable[[jax.Array], Any], data: Transition, num_updates: int, episodes: int = 50
) -> tuple[float, list[float]]:
    """Train ``AGENT_SEEDS`` agents on uniform minibatches of ``data``; evaluate each.

    Args:
        create: ``seed -> agent`` (traceable: it runs under ``vmap``).
        data: the transitions to sample minibatches from.
        num_updates: gradient steps per agent (each agent samples its own minibatches).
        episodes: Pendulum-v1 evaluation episodes per agent.

    Returns:
        The mean of the agents' evaluation returns, and the returns.
    """
    seeds = jnp.asarray(agent_seeds())
    agents = jax.vmap(create)(seeds)
    keys = jax.vmap(jax.random.key)(seeds)
    batch_size = agents.config.batch_size
    agents = _train(agents, buffer_from_arrays(data), keys, num_updates, batch_size)
    returns = [
        eval_pendulum(jax.tree.map(lambda x, i=i: x[i], agents), episodes)
        for i in range(AGENT_SEEDS)
    ]
    return float(np.mean(returns)), returns


def members(returns: list[float]) -> str:
    """The per-agent returns as one property string (``-201/-340/-188``)."""
    return "/".join(f"{r:.0f}" for r in returns)
