"""Core pytree types shared by buffers, agents and loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Params = Any
PRNGKey = jax.Array
InfoDict = dict[str, jax.Array]
LossFn = Callable[..., tuple[jax.Array, InfoDict]]
"""A loss ``(params, agent, *inputs) -> (loss, info)``, as ``networks.gradient_step`` takes it."""


class Transition(NamedTuple):
    """One environment transition (or a batch of them, with leading batch dimensions).

    Attributes:
        obs: observation before the action.
        action: action taken.
        reward: scalar reward.
        next_obs: the true next observation (the final observation when an episode ended,
            never the observation after an automatic reset).
        terminal: 1.0 when the episode terminated (no bootstrapping from ``next_obs``), 0.0 when
            it continues or was truncated by a time limit.
        next_action: optional dataset action taken at ``next_obs`` in the same episode (zeros
            where the episode ended), for ReBRAC's critic penalty; ``None`` (an empty pytree)
            everywhere else, so buffers and loops that never set it are unaffected.
        mc_return: optional discounted Monte-Carlo return-to-go from ``obs`` to the end of the
            recorded episode, for Cal-QL's calibration (``-inf`` while an online episode is
            still running); ``None`` everywhere else.
        next_action_mask: optional 1.0 where ``next_action`` is the real next action, 0.0 where
            it is unknown (the episode ended: a time limit, a termination or the dataset's last
            row); carried with ``next_action``, ``None`` everywhere else.
        from_dataset: optional 1.0 for a row of the dataset, 0.0 for a row the agent collected
            online, for agents that treat the two sources differently (H2O's real data and
            simulator rollouts, registry ``needs_source``); ``None`` everywhere else.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminal: jax.Array
    next_action: jax.Array | None = None
    mc_return: jax.Array | None = None
    next_action_mask: jax.Array | None = None
    from_dataset: jax.Array | None = None


Batch = Transition


class Rollout(NamedTuple):
    """A time-major on-policy rollout; every field has leading dimensions ``[T, N]``.

    Attributes:
        obs: observation before each action, ``[T, N, obs_dim]``.
        action: the action in [-1, 1] sent to the env, ``[T, N, act_dim]``.
        extras: what the agent's ``policy_step`` returned besides the action, stacked over time.
        reward: raw (unscaled) reward, ``[T, N]``.
        terminated: 1.0 where the episode truly terminated (no bootstrap), ``[T, N]``.
        truncated: 1.0 where a time limit ended the episode (bootstrapped), ``[T, N]``.
        next_obs: the true next observation; at an episode end the final observation, not the
            auto-reset one (so ``obs[t + 1] != next_obs[t]`` there), ``[T, N, obs_dim]``.
    """

    obs: jax.Array
    action: jax.Array
    extras: dict[str, jax.Array]
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
