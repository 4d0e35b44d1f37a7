"""The host training loop (Gymnasium envs), shared by every off-policy agent.

Each env step follows the exact order of SB3 and CleanRL: act with the current parameters, step
the env, store the transition, then ``utd_ratio * num_envs`` gradient steps (``lax.scan``) on
minibatches that may include it, and the next action from the updated parameters.

That order would leave the device idle during the env step. The minibatch rows are drawn on the
host before the env step (numpy, like SB3's replay buffer), so the loop knows whether the update
reads a row this step writes. When it does not (all but a fraction ``~batch / size`` of steps),
the update is dispatched before the env step and runs on the device while the host steps the
simulator and writes the transition: the same numbers, overlapped. Otherwise it is dispatched
after the write. Dispatch is asynchronous; the host waits only for the next action.

The buffer is donated to the jitted add, so it is written in place, and nothing is copied
between host and device except the new transition, the minibatch rows and the action. The
agent is donated to the update on accelerators only (``learn_donation``). What the loop keeps on
the host between steps (the minibatch sampler, the observation, episode statistics) is in
``jaxrl.loops.host_state``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.buffers import (
    BufferState,
    buffer_gather,
    make_replay_buffer,
    pick_sequences,
)
from jaxrl.envs.gym import HostEnv
from jaxrl.errors import ConfigError
from jaxrl.loops.acting import acting
from jaxrl.loops.config import TrainConfig
from jaxrl.loops.device import NONFINITE, guarded_update, guarded_updates
from jaxrl.loops.evaluation import evaluator
from jaxrl.loops.harness import Harness
from jaxrl.loops.host_state import HostState, LoopState, MinibatchSampler
from jaxrl.loops.mesh import available_devices
from jaxrl.loops.video import Videos
from jaxrl.registry import AgentSpec, refit_due
from jaxrl.types import Transition


def init_loop_state(spec: AgentSpec, agent: Any, env: HostEnv) -> LoopState:
    """Loop state for ``agent`` on ``env``: an empty buffer of the agent's size.

    It is also the template a checkpoint is restored into. The buffer has the optional
    ``next_action`` / ``mc_return`` fields when ``spec`` says the agent needs them.
    """
    example = Transition(
        env.obs_example,
        env.action_example,
        np.float32(0),
        env.obs_example,
        np.float32(0),
        next_action=np.zeros_like(env.action_example) if spec.needs_next_action else None,
        mc_return=np.float32(0) if spec.needs_mc_return else None,
        next_action_mask=np.float32(0) if spec.needs_next_action else None,
        from_dataset=np.float32(0) if spec.needs_source else None,
    )
    buffer = make_replay_buffer(agent.config.buffer_size)
    plan = acting(spec).init(agent, env.num_envs)
    return LoopState(agent, buffer.init(example), jnp.zeros((), jnp.int32), plan)


def _learn(
    agent: Any,
    nonfinite: jax.Array,
    buffer: BufferState,
    prior: BufferState | None,
    rows: jax.Array,
    prior_rows: jax.Array | None,
    *,
    sequences: int | None = None,
    on_nonfinite: str = "stop",
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """The host loop's update: one gradient step per row of ``rows`` (``[updates, batch]``).

    With ``prior``, each minibatch is its ``prior_rows`` of the offline data followed by its
    ``rows`` of the replay buffer (the layout of ``sample_minibatches``). With ``sequences``
    (a batch size), ``rows`` are candidate sequences ``[updates, candidates, length]`` and each
    minibatch is ``sequences`` of them (``pick_sequences``). ``nonfinite`` gains the updates
    after which the agent held a NaN (``guarded_updates``: in 'skip' mode, the discarded ones).

    The buffer is a read-only argument here and is written only by the separate ``buffer_add``
    call, which is what lets the loop dispatch this update before the env step.
    """
    if sequences is not None:
        batches = pick_sequences(buffer, rows, sequences)
    else:
        batches = buffer_gather(buffer, rows)
    if prior_rows is not None:
        first = buffer_gather(prior, prior_rows)
        batches = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), first, batches)
    agent, info, bad = guarded_updates(agent, batches, on_nonfinite)
    return agent, nonfinite + bad, info


def _chunks(rows: tuple, size: int) -> list[tuple]:
    """``rows`` (minibatches on the leading axis, and prior rows or None) in runs of ``size``.

    The pretraining burst goes through the step's own compiled update ``size`` minibatches at a
    time, in the same order, instead of compiling a second program for its length (seconds per
    run); a remainder, where ``size`` does not divide the burst, is one shorter call.
    """
    total = len(rows[0])
    return [
        tuple(None if r is None else r[i : i + size] for r in rows) for i in range(0, total, size)
    ]


def _refit(
    agent: Any, nonfinite: jax.Array, buffer: BufferState, *, on_nonfinite: str = "stop"
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """The update of an agent that refits on the whole buffer (``AgentSpec.refit_field``)."""
    agent, info, bad = guarded_update(agent, buffer, on_nonfinite)
    return agent, nonfinite + bad.astype(jnp.int32), info


def _act(
    agent: Any,
    plan: Any,
    obs: jax.Array,
    first: jax.Array,
    key: jax.Array,
    step: jax.Array,
    *,
    explore: Any,
) -> tuple[jax.Array, Any]:
    """Exploration actions for the env step numbered ``step`` (the key is folded, not carried)."""
    return explore(agent, plan, obs, first, jax.random.fold_in(key, step))


def learn_donation() -> tuple[int, ...]:
    """The arguments of ``_learn`` (agent, NaN counter) the host loop donates to its jitted call.

    Donated on accelerators (no second copy of the parameters), not on the CPU backend, where a
    donated update call cost more at one update per call: CrossQ 98 against 85 ms (1024-wide
    critics; twice the page faults), SAC 10.9 against 8.6 ms
    (``benchmarks/updates_per_call.py --donate both``). The buffer, the
    large state, is donated to ``buffer_add`` everywhere and written in place.
    """
    return () if jax.default_backend() == "cpu" else (0, 1)


def train_host(
    spec: AgentSpec,
    agent: Any,
    env: HostEnv,
    eval_env: HostEnv,
    cfg: TrainConfig,
    out: str,
    *,
    prior: BufferState | None = None,
    prior_ratio: float = 0.5,
    step_offset: int = 0,
    score_fn: Any = None,
) -> dict[str, Any]:
    """Train ``agent`` online on host envs, resuming from ``out/checkpoints`` if present.

    The same loop runs RLPD (``prior`` = a dataset mixed into every minibatch) and the online
    phase of offline-to-online training (``agent`` = the pretrained agent, optimizer states
    included, and ``step_offset`` = its offline gradient steps).

    Args:
        spec: the agent's registry entry (its name, and which optional rows it needs).
        agent: the agent to train (its config gives batch_size, utd_ratio, buffer_size and
            learning_starts); fresh, or pretrained offline.
        env: training envs (``cfg.num_envs`` copies).
        eval_env: evaluation envs (``cfg.eval_episodes`` copies).
        cfg: loop options; ``total_steps`` counts the env steps of this loop.
        out: run directory (config.json must already be there, see ``prepare_run_dir``).
        prior: offline data (a full buffer state with the online buffer's fields), or None.
        prior_ratio: fraction of each minibatch drawn from ``prior``.
        step_offset: offline gradient steps that came before: metrics rows and checkpoints are
            numbered ``step_offset + env step`` and rows get an ``env_step`` column.
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).

    Returns:
        The summary written to ``out/summary.json``.
    """
    acfg, n = agent.config, env.num_envs
    if len(available_devices(cfg.devices)) > 1:
        raise ConfigError(
            f"--devices {cfg.devices}: {cfg.env} is a Gymnasium env, stepped on the host; the "
            "host loop trains on one device. Several devices train JAX envs (brax:NAME, "
            "jax:NAME) and datasets; use --devices 1 here."
        )
    h = Harness(spec.name, cfg, [out], step_offset=step_offset, score_fn=score_fn)
    legacy = "offline" if step_offset else None  # checkpoints from before phases were recorded
    state, metas = h.resume(init_loop_state(spec, agent, env), legacy)
    # Committed to one device, as the update's outputs are: a pretrained or restored agent holds
    # uncommitted arrays, and the update would compile a second time on its second call.
    state, prior = jax.device_put((state, prior), jax.devices()[0])
    num_updates = acfg.utd_ratio * n
    refit_every = spec.refit_every(acfg)
    length = spec.sequence_length(acfg)
    sequence = None if length is None else (length, n)
    sampler = MinibatchSampler(cfg.seed, num_updates, acfg.batch_size, prior, prior_ratio, sequence)
    host = HostState(spec, acfg, env, cfg.seed, state.buffer, sampler)
    if metas:
        host.load(metas[0])
    if (done := h.completed()) is not None:
        return done[0]
    sequences = None if sequence is None else acfg.batch_size
    learn = partial(_learn, sequences=sequences, on_nonfinite=cfg.on_nonfinite)
    learn_fn = jax.jit(learn, donate_argnums=learn_donation())
    refit_fn = jax.jit(partial(_refit, on_nonfinite=cfg.on_nonfinite), donate_argnums=(0, 1))
    policy, act_key = acting(spec), jax.random.key(cfg.seed + 2)
    jit_act = jax.jit(partial(_act, explore=policy.explore))

    def act_fn(agent: Any, plan: Any, obs: np.ndarray, first: np.ndarray, step: int) -> tuple:
        return jit_act(agent, plan, obs, first, act_key, step)

    evaluate_fn = evaluator(eval_env, cfg.seed + 10_000, policy)
    videos = Videos(cfg, h.loggers, eval_env, policy, step_offset)
    info: dict[str, Any] = {}
    # With next actions the first step's rows enter the buffer one step late.
    learn_start = max(acfg.learning_starts, n if spec.needs_next_action else 0)

    def update(state: LoopState, rows: tuple) -> tuple[LoopState, dict[str, jax.Array]]:
        agent, bad, info = learn_fn(state.agent, state.nonfinite, state.buffer, prior, *rows)
        return state.replace(agent=agent, nonfinite=bad), info

    with h:
        while h.running():
            state = host.dispatch_action(state, h.step, act_fn)
            learn = h.step >= learn_start
            # Whole-buffer refits replace the minibatch steps (and run after the write).
            minibatches = learn and refit_every is None
            burst = minibatches and spec.burst_at_start and h.step == learn_start > 0
            rows, early = None, False
            if minibatches and not burst and (written := host.rows_written()) is not None:
                rows = sampler.draw(host.after_write())
                # When the update reads none of the rows this step writes, it is dispatched now,
                # before the wait for this step's action: the device queues it behind that
                # action and runs it during the env step and the write, with the same result.
                early = not np.isin(rows[0], written).any()
                if early:
                    state, info = update(state, rows)
            action = host.action(h.step)
            result = env.step(action)
            state = host.store(state, action, result)
            refit = refit_every is not None
            refit = refit and bool(refit_due(h.step + n, n, acfg.learning_starts, refit_every))
            at = h.advance(n, (num_updates + burst * learn_start) if minibatches else int(refit))
            if burst:  # pretraining on the random-action data, then the step's own update
                for rows_k in _chunks(sampler.draw(host, learn_start), num_updates):
                    state, info = update(state, rows_k)
            if minibatches and not early:
                state, info = update(state, rows if rows is not None else sampler.draw(host))
            if refit:
                agent, bad, info = refit_fn(state.agent, state.nonfinite, state.buffer)
                state = state.replace(agent=agent, nonfinite=bad)
            if learn:
                state = host.act(state, h.step, act_fn)
            host.end_step(result[2], result[3] | result[4])
            if at.log:
                row = _row(h, host, info, state, at.eval and evaluate_fn, step_offset)
                if at.eval:  # before the row is logged: the next interval's rate excludes it
                    videos(h.step, state.agent, 0, cfg.seed + 10_000)
                h.log(row)
            if at.save:
                h.save(state, host.meta(step_offset))
        h.save_if_stopped(state, host.meta(step_offset))
    extra = None
    if prior is not None or step_offset:
        extra = {"dataset": cfg.dataset, "offline_steps": step_offset, "online_steps": h.step}
    return h.finish(extra)[0]


def _row(
    h: Harness, host: HostState, info: dict, state: LoopState, evaluate_fn: Any, step_offset: int
) -> dict[str, float]:
    """The metrics row of a log point (and the evaluation, when ``evaluate_fn`` is given)."""
    rate = h.rate()  # over the last log interval, evaluation time excluded
    info, nonfinite = jax.device_get((info, state.nonfinite))
    row = {k: float(v) for k, v in info.items()}
    row[NONFINITE] = int(nonfinite)
    if host.recent:
        row["train/episode_return"] = float(np.mean(host.recent))
    row["time/env_steps_per_s"] = rate
    if evaluate_fn:
        h.record_eval(evaluate_fn(state.agent), row)
    if step_offset:
        row["env_step"] = h.step
    return row


__all__ = ["LoopState", "init_loop_state", "train_host"]
