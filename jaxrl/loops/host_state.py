"""What the host loop keeps on the host between env steps (``jaxrl.loops.host``).

``MinibatchSampler`` draws the minibatch rows on the host before the update needs them (so the loop
knows whether the update reads a row the env step writes), ``BufferRows`` says where a buffer's rows
are, and ``HostState`` holds the observation, the warm-up RNG, episode statistics, the pending
action and the buffer's write position, writes each transition into the device buffer, and
saves all of it as a checkpoint's JSON metadata.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import struct

from jaxrl.buffers import BufferState, buffer_add, sequence_offsets_bound, sequence_rows, set_rows
from jaxrl.data.episodes import EpisodeTracker, pad_rows
from jaxrl.envs.gym import HostEnv
from jaxrl.registry import AgentSpec
from jaxrl.types import Transition


class LoopState(struct.PyTreeNode):
    """Device-side loop state (what a checkpoint stores): agent, replay buffer and plan.

    ``nonfinite`` counts the updates after which the agent held a NaN; ``plan`` is a planner's
    carry between env steps (an empty tuple for policies, see ``jaxrl.loops.acting``). The
    minibatch RNG lives on the host (see ``MinibatchSampler``).
    """

    agent: Any
    buffer: BufferState
    nonfinite: jax.Array = np.int32(0)
    plan: Any = ()


class MinibatchSampler:
    """Minibatch rows drawn on the host, uniformly with replacement, before they are needed.

    ``num_updates`` minibatches of ``batch_size`` rows each: ``round(prior_ratio * batch_size)``
    rows of the offline data (when there is some) and the rest of the replay buffer. With
    ``sequence = (length, stride)``, twice ``batch_size`` candidate sequences per minibatch,
    which the device narrows to ``batch_size`` whole ones (``pick_sequences``).
    """

    def __init__(
        self,
        seed: int,
        num_updates: int,
        batch_size: int,
        prior: Any,
        ratio: float,
        sequence: tuple[int, int] | None = None,
    ):
        self.rng = np.random.default_rng([seed, 3])
        n_prior = int(round(ratio * batch_size)) if prior is not None and ratio > 0 else 0
        self.prior_size = int(prior.size) if n_prior else 0
        self.num_updates, self.sequence = num_updates, sequence
        self.cols, self.n_prior = batch_size * (2 if sequence else 1) - n_prior, n_prior

    def draw(self, buffer: Any, num_updates: int | None = None) -> tuple:
        """Minibatch rows of ``buffer`` and of the offline data (or None).

        ``buffer`` has the ``pos``, ``size`` and ``capacity`` the buffer will have when the
        update reads it; ``num_updates`` minibatches are drawn (default: one step's).
        """
        num = num_updates or self.num_updates
        if self.sequence is None:
            rows = self.rng.integers(0, max(buffer.size, 1), (num, self.cols), dtype=np.int32)
        else:
            bound = sequence_offsets_bound(buffer.size, *self.sequence, xp=np)
            offsets = self.rng.integers(0, bound, (num, self.cols))
            rows = sequence_rows(buffer, offsets, *self.sequence, xp=np).astype(np.int32)
        if not self.prior_size:
            return rows, None
        prior_rows = self.rng.integers(0, self.prior_size, (num, self.n_prior), dtype=np.int32)
        return rows, prior_rows


class BufferRows(NamedTuple):
    """Where a buffer's rows are: next row to write, valid rows, capacity."""

    pos: int
    size: int
    capacity: int


class HostState:
    """What the loop keeps on the host between steps; checkpointed as JSON metadata.

    The observation, the warm-up RNG, the minibatch sampler, running episode statistics, the
    action computed after the last update (``pending``), where the buffer's next row goes
    (``pos``, ``size``, mirrored from the device) and, for agents whose rows need later steps
    (next actions, Monte-Carlo returns), the ``EpisodeTracker``.
    """

    def __init__(
        self,
        spec: AgentSpec,
        acfg: Any,
        env: HostEnv,
        seed: int,
        buffer: Any,
        sampler: MinibatchSampler,
    ):
        n = env.num_envs
        self.spec, self.env, self.capacity = spec, env, acfg.buffer_size
        self.learning_starts, self.sampler = acfg.learning_starts, sampler
        self.pos, self.size = (int(x) for x in jax.device_get((buffer.pos, buffer.size)))
        self.np_rng = np.random.default_rng(seed)
        self.obs, self.first = env.reset(seed=seed), np.ones(n, bool)
        self.ep_return, self.ep_length = np.zeros(n), np.zeros(n, np.int64)
        self.recent: deque[float] = deque(maxlen=20)
        self.pending: Any = None
        self.tracker = None
        if spec.needs_next_action or spec.needs_mc_return:
            discount = float(acfg.discount) if spec.needs_mc_return else 1.0
            self.tracker = EpisodeTracker(n, acfg.buffer_size, discount)
        self.add_fn = jax.jit(buffer_add, donate_argnums=0)
        self.mc_fn = jax.jit(partial(set_rows, field="mc_return"), donate_argnums=0)
        a = env.action_dim
        self.no_next_action = np.zeros((n, a), np.float32) if spec.needs_next_action else None
        self.no_next_mask = np.zeros(n, np.float32) if spec.needs_next_action else None
        self.unknown_return = np.full(n, -np.inf, np.float32) if spec.needs_mc_return else None
        self.online_rows = np.zeros(n, np.float32) if spec.needs_source else None

    def dispatch_action(self, state: LoopState, step: int, act_fn: Any) -> LoopState:
        """Start computing the first policy action (later ones are dispatched after updates)."""
        if step >= self.learning_starts and self.pending is None:
            return self.act(state, step, act_fn)
        return state

    def act(self, state: LoopState, step: int, act_fn: Any) -> LoopState:
        """Dispatch the policy's action for the current observation (``pending``)."""
        self.pending, plan = act_fn(state.agent, state.plan, self.obs, self.first, step)
        return state.replace(plan=plan)

    def after_write(self) -> Any:
        """Where the buffer's rows will be once the next ``store`` wrote one row per env."""
        n = self.env.num_envs
        pos, size = (self.pos + n) % self.capacity, min(self.size + n, self.capacity)
        return BufferRows(pos, size, self.capacity)

    def action(self, step: int) -> np.ndarray:
        """Uniform actions before ``learning_starts``, then the policy's (``pending``)."""
        if step < self.learning_starts:
            shape = (self.env.num_envs, self.env.action_dim)
            return self.np_rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        return np.asarray(self.pending)

    def rows_written(self) -> np.ndarray | None:
        """The buffer rows the next ``store`` writes, or None where they are not known ahead.

        Agents whose rows wait for later steps (next actions, Monte-Carlo returns) write rows
        of earlier steps too, so their updates always wait for the write.
        """
        if self.tracker is not None:
            return None
        return (self.pos + np.arange(self.env.num_envs)) % self.capacity

    def store(self, state: LoopState, action: Any, out: tuple) -> LoopState:
        """Add the step ``(obs, action) -> out`` (``env.step``'s result) to the buffer.

        Rows that need their next action enter one step late, once it is known (``hold``).
        """
        next_obs, new_obs, reward, terminated, truncated = out
        transition = Transition(
            self.obs,
            action,
            reward,
            next_obs,
            terminated.astype(np.float32),
            next_action=self.no_next_action,
            mc_return=self.unknown_return,
            next_action_mask=self.no_next_mask,
            from_dataset=self.online_rows,
        )
        self.obs, done = new_obs, terminated | truncated
        self.first = done
        if self.spec.needs_next_action:
            held = self.tracker.hold(transition, done)
            if held is None:
                return state
            transition, done = held
        if self.tracker is not None:
            self.tracker.next_rows()
        state = state.replace(buffer=self.add_fn(state.buffer, transition))
        n = len(transition.reward)
        self.pos, self.size = (self.pos + n) % self.capacity, min(self.size + n, self.capacity)
        if self.tracker is not None:
            for rows, returns in self.tracker.record(transition.reward, done):
                if self.spec.needs_mc_return:
                    rows, returns = pad_rows(rows, returns, self.capacity)
                    buffer = self.mc_fn(state.buffer, rows=rows, values=returns)
                    state = state.replace(buffer=buffer)
        return state

    def end_step(self, reward: np.ndarray, done: np.ndarray) -> None:
        """Episode statistics (``train/episode_return``: the mean of the last 20 episodes)."""
        self.ep_return += reward
        self.ep_length += 1
        for i in np.flatnonzero(done):
            self.recent.append(float(self.ep_return[i]))
            self.ep_return[i], self.ep_length[i] = 0.0, 0

    def meta(self, step_offset: int) -> dict[str, Any]:
        """The checkpoint's JSON record of the host side."""
        return {
            "np_rng": self.np_rng.bit_generator.state,
            "sample_rng": self.sampler.rng.bit_generator.state,
            "ep_return": self.ep_return.tolist(),
            "ep_length": self.ep_length.tolist(),
            "recent_returns": list(self.recent),
            "env_state": self.env.get_state(),
            "pending_action": None if self.pending is None else np.asarray(self.pending).tolist(),
            "first": self.first.tolist(),
            "step_offset": step_offset,
            "episodes": None if self.tracker is None else self.tracker.state(),
        }

    def load(self, meta: dict[str, Any]) -> None:
        """Restore ``meta``; a simulator that cannot save its state restarts its episodes."""
        self.np_rng.bit_generator.state = meta["np_rng"]
        self.sampler.rng.bit_generator.state = meta["sample_rng"]
        self.ep_return = np.array(meta["ep_return"])
        self.ep_length = np.array(meta["ep_length"], np.int64)
        self.recent.extend(meta["recent_returns"])
        if meta.get("pending_action") is not None:
            self.pending = np.asarray(meta["pending_action"], np.float32)
        self.first = np.asarray(meta.get("first", self.first), bool)
        if self.tracker is not None:
            self.tracker.load(meta["episodes"])
        if meta.get("env_state") is not None and self.env.savable:
            self.obs = self.env.set_state(meta["env_state"])
            return
        self.ep_return[:], self.ep_length[:], self.pending = 0.0, 0, None  # action for old obs
        self.first[:] = True
        if self.tracker is not None:
            self.tracker.forget_running()
        print(
            f"Resumed at step {meta['step']}: {self.env.env_id} cannot save its simulator state, "
            "so the interrupted episodes restart from a reset (the run is not bit-identical)."
        )
