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

from jaxrl.buffers import BufferState, buffer_sample
from jaxrl.evaluation import evaluator
from jaxrl.loops.config import TrainConfig
from jaxrl.loops.harness import NONFINITE, Harness, compile_cache, nonfinite, strongly_typed
from jaxrl.registry import AgentSpec


class OfflineState(struct.PyTreeNode):
    """What the offline loop carries and checkpoints: the agent and the minibatch RNG.

    The dataset is not part of it (it is read again from ``--dataset`` on resume).
    ``nonfinite`` counts the updates after which the agent held a NaN.
    """

    agent: Any
    rng: jax.Array
    nonfinite: jax.Array = np.int32(0)


def _offline_chunk(
    state: OfflineState, data: BufferState, *, num_updates: int, batch_size: int
) -> tuple[OfflineState, dict[str, jax.Array]]:
    """``num_updates`` gradient steps on uniform minibatches of ``data`` under ``lax.scan``."""
    rng, key = jax.random.split(state.rng)

    def body(agent: Any, k: jax.Array) -> tuple[Any, tuple[dict[str, jax.Array], jax.Array]]:
        agent, info = agent.update(buffer_sample(data, k, batch_size))
        return agent, (info, nonfinite(agent))

    agent, (infos, bad) = jax.lax.scan(body, state.agent, jax.random.split(key, num_updates))
    count = state.nonfinite + jnp.sum(bad, dtype=jnp.int32)
    return OfflineState(agent, rng, count), jax.tree.map(lambda x: x[-1], infos)


def train_offline(
    spec: AgentSpec,
    agent: Any,
    data: BufferState,
    eval_env: Any,
    cfg: TrainConfig,
    out: str,
    *,
    score_fn: Any = None,
) -> dict[str, Any]:
    """Train ``agent`` on a fixed dataset for ``cfg.total_steps`` gradient steps.

    Resumes from ``out/checkpoints``.

    Args:
        spec: the agent's registry entry.
        agent: a freshly created agent, its ``norm`` already set from the dataset.
        data: the dataset as a full buffer state (``Dataset.buffer``).
        eval_env: evaluation env (``cfg.eval_episodes`` copies; Gymnasium or JAX).
        cfg: loop options; ``total_steps``, ``eval_every``, ``log_every`` count gradient steps.
        out: run directory (``prepare_run_dir`` first).
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).

    Returns:
        The summary written to ``out/summary.json``.
    """
    where = cfg.dataset or cfg.env
    h = Harness(spec.name, cfg, [out], phase="offline", where=where, score_fn=score_fn)
    fresh = OfflineState(agent, jax.random.key(cfg.seed + 1), np.int32(0))
    state, _ = h.resume(strongly_typed(fresh))
    if (done := h.completed()) is not None:
        return done[0]
    run_chunk = compile_cache(
        lambda n: jax.jit(
            partial(_offline_chunk, num_updates=n, batch_size=agent.config.batch_size),
            donate_argnums=0,
        )
    )
    evaluate_fn = evaluator(eval_env, cfg.seed + 10_000)
    with h:
        while h.running():
            n = h.cadence.chunk(h.step)
            state, info = run_chunk(n)(state, data)
            info, nonfinite = jax.device_get((info, state.nonfinite))  # waits for the chunk
            at = h.advance(n, n)
            row = {k: float(v) for k, v in info.items()}
            row[NONFINITE] = int(nonfinite)
            row["time/updates_per_s"] = h.rate()  # compute time: the chunk has finished
            if at.eval:
                h.record_eval(evaluate_fn(state.agent), row)
            if at.log:
                h.log(row)
            if at.save:
                h.save(state)
        if h.stop.raised:
            h.save(state)
    return h.finish({"env_steps_per_s": 0.0, "dataset": cfg.dataset})[0]


__all__ = ["OfflineState", "train_offline"]
