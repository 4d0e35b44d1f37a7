"""Replay fields that depend on later steps of the same episode, for datasets and online buffers.

Two optional ``Transition`` fields are not known when a step happens: ``next_action`` (ReBRAC's
critic penalty needs the action taken at ``next_obs``, known one step later) and ``mc_return``
(Cal-QL calibrates its penalty with the discounted return-to-go, known when the episode ends).
For a dataset both are computed from whole episodes (``next_actions``, ``monte_carlo_returns``);
online, ``EpisodeTracker`` holds each step's rows until the next action is known (``hold``) and
remembers which buffer rows each running episode wrote, so the host loop can fill in the returns
when the episode ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl.errors import DatasetError
from jaxrl.types import Transition


def monte_carlo_returns(
    rewards: np.ndarray, terminals: np.ndarray, timeouts: np.ndarray, discount: float
) -> np.ndarray:
    """Discounted return-to-go ``G_t = r_t + discount * G_{t+1}`` of every row of a dataset.

    Rows are consecutive steps; an episode ends at a row with ``terminals`` or ``timeouts`` set,
    and the last row always ends one. After an episode's last row the return is 0: exact at a
    terminal; at a timeout the unseen tail is left out, as in Cal-QL's reference code (Nakamoto
    et al., 2023), so ``G`` is the return of the recorded steps only.

    Args:
        rewards: ``[N]`` rewards.
        terminals: ``[N]`` bools, true where the episode terminated.
        timeouts: ``[N]`` bools, true where a time limit (or the data) cut the episode.
        discount: the discount factor.

    Returns:
        ``[N]`` float32 returns.
    """
    rewards = np.asarray(rewards, np.float64)
    terminals, timeouts = np.asarray(terminals, bool), np.asarray(timeouts, bool)
    if not (rewards.ndim == 1 and rewards.shape == terminals.shape == timeouts.shape):
        raise DatasetError(
            f"rewards {rewards.shape}, terminals {terminals.shape} and timeouts {timeouts.shape} "
            "must be [N] arrays of one length."
        )
    ends = terminals | timeouts
    out = np.empty_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if ends[t] or t == len(rewards) - 1:
            running = 0.0
        running = rewards[t] + discount * running
        out[t] = running
    return out.astype(np.float32)


def next_actions(
    actions: np.ndarray, terminals: np.ndarray, timeouts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's next action in the same episode, and a mask of the rows where it is known.

    ReBRAC's critic penalty compares the target policy's action at ``next_obs`` with the action
    the data took there. That action is unknown where the episode ended: at a time limit (the
    ReBRAC reference drops those rows from its dataset), at a termination (where the penalty is
    multiplied away by ``1 - terminal`` anyway) and at the dataset's last row. There the next
    action is 0 and the mask is 0, and the critic leaves the penalty out.

    Args:
        actions: ``[N, act_dim]`` actions of consecutive rows.
        terminals: ``[N]`` bools, true where the episode terminated.
        timeouts: ``[N]`` bools, true where a time limit (or the data) cut the episode.

    Returns:
        ``([N, act_dim] next actions, [N] float32 mask)``.
    """
    terminals, timeouts = np.asarray(terminals, bool), np.asarray(timeouts, bool)
    known = ~(terminals | timeouts)
    known[-1:] = False
    nxt = np.zeros_like(actions)
    nxt[:-1] = actions[1:]
    nxt[~known] = 0
    return nxt, known.astype(np.float32)


class EpisodeTracker:
    """Host-side record of the buffer rows written by each running episode of ``num_envs`` envs.

    The loop asks it for the row indices of the next ``add`` (``next_rows``), then reports
    rewards and episode ends (``record``), which returns the rows and Monte-Carlo returns of
    every finished episode. For agents that need ``next_action``, ``hold`` keeps each step's
    rows back until the env's next action is known, so no row is stored without it.

    Args:
        num_envs: parallel envs; ``add`` writes one row per env.
        capacity: the online buffer's capacity (rows wrap around).
        discount: discount of the Monte-Carlo returns.
        pos: the buffer's next write position (``BufferState.pos``) when starting or resuming.
    """

    def __init__(self, num_envs: int, capacity: int, discount: float, pos: int = 0):
        self.num_envs, self.capacity, self.discount = num_envs, capacity, discount
        self.pos = int(pos)
        self.rows: list[list[int]] = [[] for _ in range(num_envs)]
        self.rewards: list[list[float]] = [[] for _ in range(num_envs)]
        self._pending: np.ndarray | None = None
        self._held: dict[str, Any] | None = None

    def next_rows(self) -> np.ndarray:
        """Rows the next ``add`` of one step of every env writes (and advance the position)."""
        rows = (self.pos + np.arange(self.num_envs)) % self.capacity
        self.pos = int((self.pos + self.num_envs) % self.capacity)
        self._pending = rows
        return rows

    def record(self, reward: np.ndarray, done: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Note the step just added; returns ``(rows, mc_returns)`` of each episode that ended.

        An episode longer than the buffer has had its first rows overwritten; only the rows it
        still owns are returned.
        """
        if self._pending is None:
            raise RuntimeError("EpisodeTracker.record called without next_rows for this step.")
        finished = []
        for i, row in enumerate(self._pending):
            self.rows[i].append(int(row))
            self.rewards[i].append(float(reward[i]))
            if done[i]:
                rewards = np.asarray(self.rewards[i])
                ends = np.zeros(len(rewards), bool)
                returns = monte_carlo_returns(rewards, ends, ends, self.discount)
                keep = min(len(rewards), self.capacity)
                finished.append((np.asarray(self.rows[i][-keep:], np.int32), returns[-keep:]))
                self.rows[i], self.rewards[i] = [], []
            elif len(self.rows[i]) > self.capacity:  # bound memory: the oldest rows are gone
                self.rows[i] = self.rows[i][-self.capacity :]
                self.rewards[i] = self.rewards[i][-self.capacity :]
        self._pending = None
        return finished

    def hold(
        self, transition: Transition, done: np.ndarray
    ) -> tuple[Transition, np.ndarray] | None:
        """Keep one step's rows until their next actions are known; return the previous step's.

        A row enters the buffer only once its ``next_action`` is written, so no minibatch ever
        sees a row whose next action is still missing. The returned rows (the previous step of
        every env) get ``next_action`` = this step's action and ``next_action_mask`` = 1 where
        that step did not end its episode; where it did (a time limit or a termination) the
        next action stays 0 with mask 0. The loop adds them, then calls ``next_rows`` and
        ``record`` with the returned ``done`` flags.

        Args:
            transition: this step's rows (numpy, leading axis ``num_envs``) with ``next_action``
                and ``next_action_mask`` fields (their values are ignored).
            done: ``[num_envs]`` bools, true where this step ended the episode.

        Returns:
            ``(previous rows, their done flags)``, or ``None`` on the first step (nothing held).
        """
        rows = {k: np.array(v) for k, v in transition._asdict().items() if v is not None}
        held, self._held = self._held, {"rows": rows, "done": np.array(done, bool)}
        if held is None:
            return None
        rows = {
            k: np.asarray(v, np.asarray(getattr(transition, k)).dtype)
            for k, v in held["rows"].items()
        }
        ended = np.asarray(held["done"], bool)
        keep = (~ended).astype(np.float32)
        rows["next_action"] = np.asarray(transition.action, np.float32) * keep[:, None]
        rows["next_action_mask"] = keep
        return Transition(**rows), ended

    def forget_running(self) -> None:
        """Drop the running episodes (after a resume that restarts the envs from a reset)."""
        self.rows = [[] for _ in range(self.num_envs)]
        self.rewards = [[] for _ in range(self.num_envs)]
        self._held = None

    def state(self) -> dict[str, Any]:
        """JSON-serializable state for a checkpoint's metadata."""
        held = self._held and {
            "rows": {k: np.asarray(v).tolist() for k, v in self._held["rows"].items()},
            "done": np.asarray(self._held["done"]).tolist(),
        }
        return {"pos": self.pos, "rows": self.rows, "rewards": self.rewards, "held": held}

    def load(self, state: dict[str, Any]) -> None:
        """Restore what ``state`` returned."""
        self.pos = int(state["pos"])
        self.rows = [list(map(int, r)) for r in state["rows"]]
        self.rewards = [list(map(float, r)) for r in state["rewards"]]
        self._held = state.get("held")


def pad_rows(rows: np.ndarray, values: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``rows`` / ``values`` to a power of two with out-of-range rows (dropped on scatter).

    The jitted scatter then compiles for a handful of lengths only.
    """
    n = 1 << max(int(len(rows)) - 1, 0).bit_length()
    padded_rows = np.full(n, capacity, np.int32)
    padded_values = np.zeros((n, *values.shape[1:]), values.dtype)
    padded_rows[: len(rows)], padded_values[: len(values)] = rows, values
    return padded_rows, padded_values


__all__ = ["EpisodeTracker", "monte_carlo_returns", "next_actions", "pad_rows"]
