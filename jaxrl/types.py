"""Core pytree types shared by buffers, agents and loops."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

Params = Any
PRNGKey = jax.Array
InfoDict = dict[str, jax.Array]


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
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminal: jax.Array


Batch = Transition
