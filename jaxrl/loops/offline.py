"""The offline loop: gradient steps on a device-resident dataset, in chunks of ``lax.scan``.

Between chunks the host logs, evaluates the deterministic policy (Gymnasium or JAX env) and
checkpoints the agent and the minibatch RNG (not the dataset, which is read again on resume).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.buffers import MEMBERS, BufferState, buffer_sample, split_rows
from jaxrl.loops.config import TrainConfig
from jaxrl.loops.device import NONFINITE, compile_cache, guarded_updates, strongly_typed
from jaxrl.loops.evaluation import evaluator
from jaxrl.loops.harness import Harness
from jaxrl.loops.mesh import check_data_parallel, host_array, make_layout, member
from jaxrl.loops.video import Videos
from jaxrl.registry import AgentSpec


class OfflineState(struct.PyTreeNode):
    """What the offline loop carries and checkpoints: the agent and the minibatch RNG.

    The dataset is not part of it (it is read again from ``--dataset`` on resume).
    ``nonfinite`` counts the updates after which the agent held a NaN.
    """

    agent: Any
    rng: jax.Array
    nonfinite: jax.Array = np.int32(0)


def _member_updates(
    state: OfflineState,
    data: BufferState,
    *,
    num_updates: int,
    batch_size: int,
    on_nonfinite: str = "stop",
) -> tuple[OfflineState, dict[str, jax.Array]]:
    """``num_updates`` gradient steps on uniform minibatches of ``data`` under ``lax.scan``.

    ``state.nonfinite`` gains the updates that left a NaN in the agent (``guarded_updates``).
    """
    rng, key = jax.random.split(state.rng)
    keys = jax.random.split(key, num_updates)

    def sample(key: jax.Array) -> Any:  # each device computes its rows (``split_rows``)
        return split_rows(buffer_sample(data, key, batch_size))

    agent, info, bad = guarded_updates(state.agent, keys, on_nonfinite, batch=sample)
    return OfflineState(agent, rng, state.nonfinite + bad), info


def _offline_chunk(
    state: OfflineState, data: BufferState, **chunk: Any
) -> tuple[OfflineState, dict[str, jax.Array]]:
    """``_member_updates`` for every member on the leading axis of ``state``.

    One member runs unbatched, as in the fused loop: under ``vmap`` a ``lax.cond`` whose
    predicate is batched becomes a ``select`` that runs both branches, so a delayed actor step
    (``td3.delayed_policy_update``, with whatever search an agent does in it) would run on
    every update, and a size-1 batch axis makes XLA emit slower batched matmuls (an agent with
    a nearest-row search on a 200k-row dataset: 20 updates/s vmapped, 51 unbatched). The axis
    is dropped and re-added outside the scan.
    """
    if jax.tree.leaves(state)[0].shape[0] > 1:
        run = jax.vmap(partial(_member_updates, **chunk), (0, None), spmd_axis_name=MEMBERS)
        return run(state, data)
    state, info = _member_updates(jax.tree.map(lambda x: x[0], state), data, **chunk)
    return jax.tree.map(lambda x: x[None], (state, info))


def train_offline(
    spec: AgentSpec,
    agent: Any,
    data: BufferState,
    eval_env: Any,
    cfg: TrainConfig,
    out: str | list[str],
    *,
    score_fn: Any = None,
    seeds: list[int] | None = None,
) -> Any:
    """Train ``agent`` on a fixed dataset for ``cfg.total_steps`` gradient steps.

    Members (a sweep's settings x seeds) train as one vmapped program on the shared dataset:
    pass ``out`` as a list of run directories and ``agent`` stacked on a leading member axis
    (``jaxrl.tune.grid.member_agents``). Each member resumes from its own ``checkpoints`` and
    evaluates on the host in turn.

    Args:
        spec: the agent's registry entry.
        agent: a freshly created agent, its ``norm`` already set from the dataset (members:
            stacked agents).
        data: the dataset as a full buffer state (``Dataset.buffer``).
        eval_env: evaluation env (``cfg.eval_episodes`` copies; Gymnasium or JAX).
        cfg: loop options; ``total_steps``, ``eval_every``, ``log_every`` count gradient steps.
        out: run directory (``prepare_run_dir`` first), or one per member.
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).
        seeds: each member's seed (default ``cfg.seed + i``).

    Returns:
        The summary written to ``out/summary.json`` (members: the list of summaries).
    """
    outs = [out] if isinstance(out, str) else list(out)
    seeds = list(seeds) if seeds is not None else [cfg.seed + i for i in range(len(outs))]
    agents = jax.tree.map(lambda x: jnp.asarray(x)[None], agent) if isinstance(out, str) else agent
    where = cfg.dataset or cfg.env
    h = Harness(
        spec.name,
        cfg,
        outs,
        phase="offline",
        where=where,
        score_fn=score_fn,
        stacked=True,
        seeds=seeds,
    )
    rngs = jax.vmap(lambda s: jax.random.key(s + 1))(jnp.asarray(seeds, jnp.int32))
    fresh = OfflineState(agents, rngs, np.zeros(len(outs), np.int32))
    state, _ = h.resume(strongly_typed(fresh))
    if (done := h.completed()) is not None:
        return done[0] if isinstance(out, str) else done
    batch_size = agents.config.batch_size  # static: the members share it
    mode = cfg.on_nonfinite
    layout = make_layout(cfg.devices, len(outs))
    check_data_parallel(spec, layout, f"--devices {cfg.devices}", batch_size=batch_size)
    shardings = layout.stacked(state)
    state = layout.place(state, shardings)
    data = layout.place(data, layout.sharding())  # the dataset: whole on every device
    run_chunk = compile_cache(
        lambda n: layout.traced(
            jax.jit(
                partial(_offline_chunk, num_updates=n, batch_size=batch_size, on_nonfinite=mode),
                donate_argnums=0,
                out_shardings=(shardings, None),
            )
        )
    )
    evaluate_fn = evaluator(eval_env, cfg.seed + 10_000)
    videos = Videos(cfg, h.loggers, eval_env)
    with h:
        while h.running():
            n = h.cadence.chunk(h.step)
            state, info = run_chunk(n)(state, data)
            info, nonfinite = jax.tree.map(host_array, (info, state.nonfinite))  # waits
            at = h.advance(n, n)
            rows = [
                {k: float(v[i]) for k, v in info.items()} | {NONFINITE: int(nonfinite[i])}
                for i in range(len(outs))
            ]
            for row in rows:
                row["time/updates_per_s"] = h.rate()  # compute time: the chunk has finished
            if at.eval:
                returns = [
                    evaluate_fn(member(state.agent, i), s + 10_000) for i, s in enumerate(seeds)
                ]
                h.record_eval(np.stack(returns), *rows)
                for i, s in enumerate(seeds):
                    videos(h.step, member(state.agent, i), i, s + 10_000)
            if at.log:
                h.log(*rows)
            if at.save:
                h.save(state)
        h.save_if_stopped(state)
    summaries = h.finish({"env_steps_per_s": 0.0, "dataset": cfg.dataset})
    return summaries[0] if isinstance(out, str) else summaries


__all__ = ["OfflineState", "train_offline"]
