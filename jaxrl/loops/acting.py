"""How the loops and evaluations act with an agent: one interface for policies and planners.

A policy agent acts from the observation alone (``sample_actions`` / ``eval_actions``). A
planner (registry kind ``planner``) carries its plan from one env step to the next and restarts
it at an episode's first step (``init_plan`` / ``plan_actions``). The loops hold a ``carry``
for every agent (an empty tuple for policies) and act through ``Acting``, so they never ask an
agent what it can do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from jaxrl.registry import AgentSpec


class Acting(NamedTuple):
    """The acting functions of one kind of agent.

    Attributes:
        init: ``(agent, num_envs) -> carry``, the carry before the first step.
        explore: ``(agent, carry, obs, first, key) -> (actions, carry)``, training actions;
            ``obs`` is ``[num_envs, ...]`` and ``first`` is ``[num_envs]``, True at the first
            step of an episode.
        exploit: the same for evaluation (deterministic for policies; planners still sample).
    """

    init: Callable[[Any, int], Any]
    explore: Callable[..., tuple[jax.Array, Any]]
    exploit: Callable[..., tuple[jax.Array, Any]]


def _no_carry(agent: Any, num_envs: int) -> tuple:
    del agent, num_envs
    return ()


def _sample(agent: Any, carry: Any, obs: jax.Array, first: jax.Array, key: jax.Array) -> tuple:
    del first
    return agent.sample_actions(obs, key), carry


def _deterministic(
    agent: Any, carry: Any, obs: jax.Array, first: jax.Array, key: jax.Array
) -> tuple:
    del first, key
    return agent.eval_actions(obs), carry


def _init_plan(agent: Any, num_envs: int) -> Any:
    return agent.init_plan(num_envs)


def _plan_explore(agent: Any, plan: Any, obs: jax.Array, first: jax.Array, key: jax.Array) -> tuple:
    return agent.plan_actions(plan, obs, first, key, explore=True)


def _plan_exploit(agent: Any, plan: Any, obs: jax.Array, first: jax.Array, key: jax.Array) -> tuple:
    return agent.plan_actions(plan, obs, first, key, explore=False)


POLICY = Acting(_no_carry, _sample, _deterministic)
PLANNER = Acting(_init_plan, _plan_explore, _plan_exploit)


def acting(spec: AgentSpec) -> Acting:
    """The acting functions of ``spec``'s agent (its kind decides)."""
    return PLANNER if spec.kind == "planner" else POLICY


__all__ = ["PLANNER", "POLICY", "Acting", "acting"]
