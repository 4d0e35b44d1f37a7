"""What a fused-loop chunk reports: per-member metrics, episode sums, and the rows the host logs.

A chunk returns, per member, the last update's metrics and sums over the episodes that ended
in it; the host turns them into one metrics row per member (``member_rows``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.loops.device import NONFINITE


def episode_stats(env_state: Any) -> tuple[dict[str, jax.Array], jax.Array]:
    """Sums over the episodes that ended on the last step, and their count.

    Summed: the return, and whatever a wrapper reports per episode in
    ``info["episode_values"]`` (e.g. the drawn physics of a randomized env,
    ``jaxrl.envs.privileged.RecordPhysics``); the loop logs their means per log interval.
    """
    ended = (env_state.terminated + env_state.truncation) > 0
    values = {"train/episode_return": env_state.info["episode_return"]}
    values.update(env_state.info.get("episode_values", {}))
    sums = {k: jnp.sum(v * ended) for k, v in values.items()}
    return sums, jnp.sum(ended.astype(jnp.float32))


SUM = "sum:"
"""Prefix of the chunk metrics that are sums over ended episodes (``episode_stats``)."""


def member_rows(
    metrics: dict[str, np.ndarray], learned: bool, rate: float
) -> list[dict[str, float]]:
    """One metrics row per member from a chunk's (host) metrics."""
    rows = []
    for i in range(len(metrics["train/episodes"])):
        episodes = metrics["train/episodes"][i]
        # Off-policy agents report zeros before learning_starts: do not log those as losses.
        row = {
            k: float(v[i])
            for k, v in metrics.items()
            if learned and not k.startswith((SUM, "train/episodes"))
        }
        row[NONFINITE] = float(metrics[NONFINITE][i])
        if episodes > 0:  # means over the episodes that ended in the chunk
            row.update(
                {
                    k[len(SUM) :]: float(v[i] / episodes)
                    for k, v in metrics.items()
                    if k.startswith(SUM)
                }
            )
        row["time/env_steps_per_s"] = rate
        rows.append(row)
    return rows


def chunk_metrics(outs: tuple[Any, ...], nonfinite: jax.Array) -> dict[str, jax.Array]:
    """A chunk's metrics from its iterations' outputs ``(infos, updated, sums, count)``.

    Each leaf has the iteration axis first and the member axis second. The metrics are the last
    update's (zeros if none); each member finds its own (equal) index, so that members on
    different devices need nothing from each other. ``nonfinite``: each member's NaN count.
    """
    infos, updated, sums, count = outs
    num_iters = updated.shape[0]
    last = num_iters - 1 - jnp.argmax(updated[::-1], axis=0)  # [members]
    at = lambda v: jnp.take_along_axis(v, last.reshape(1, -1, *[1] * (v.ndim - 2)), 0)[0]  # noqa: E731
    metrics = {k: at(v) for k, v in infos.items()}
    metrics.update({SUM + k: v.sum(0) for k, v in sums.items()})
    metrics["train/episodes"] = count.sum(0)
    metrics[NONFINITE] = nonfinite
    return metrics


__all__ = ["SUM", "chunk_metrics", "episode_stats", "member_rows"]
