"""Where one iteration of the fused loop goes, before and after the in-place replay buffer.

An off-policy iteration of the fused loop is [act, env step, buffer add, updates]. This script
times chunks of the loop built from growing prefixes of that iteration, each compiled through
the loop's own chunk driver (``jit_chunk``: ``lax.scan`` over iterations, state donated):

  env      the JAX env stepped with uniform random actions;
  +act     actions from the SAC policy instead;
  +add     the transitions written into the replay buffer;
  full     plus one minibatch sample and SAC update per iteration (the loop's real iteration).

Each part's cost is the difference of consecutive rows. ``--chunk before`` builds the chunk as
the loop did before its buffer writes were made in place (one member's size-1 axis squeezed and
restored inside the scan body, where XLA copied every buffer field on each iteration), to give the
before/after table.

    .venv/bin/python benchmarks/profile_fused.py            # both chunks, 10k and 1M rows

SAC (256, 256), batch 256, on ``jax:pendulum``; 1 env, and 64 envs with 1 update per iteration.
Time per iteration is the median of 3 timed calls of a compiled chunk (compilation excluded).
Writes ``benchmarks/results/profile_fused.{md,json}``. Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.buffers import buffer_add
from jaxrl.envs import make_jax_env
from jaxrl.loops.device import NONFINITE
from jaxrl.loops.fused import _off_policy_iteration, init_fused_state, jit_chunk
from jaxrl.loops.fused_metrics import episode_stats as _episode_stats
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "profile_fused")
PARTS = ("env", "+act", "+add", "full")


def _partial_iteration(state: Any, step: jax.Array, *, env: Any, part: str) -> tuple[Any, Any]:
    """An iteration cut after ``part``: ``env``, ``+act`` or ``+add`` (no updates)."""
    del step
    rng, k_act, k_rand = jax.random.split(state.rng, 3)
    obs = state.env.obs
    if part == "env":
        action = jax.random.uniform(k_rand, (env.num_envs, env.action_size), minval=-1, maxval=1)
    else:
        action = state.agent.sample_actions(obs, k_act)
    env_state = env.step(state.env, action)
    buffer = state.buffer
    if part == "+add":
        transition = Transition(
            obs, action, env_state.reward, env_state.info["final_obs"], env_state.terminated
        )
        buffer = buffer_add(buffer, transition)
    return state.replace(buffer=buffer, env=env_state, rng=rng), ({}, *_episode_stats(env_state))


def _chunk_before(
    states: Any, step: jax.Array, *, iteration: Any, num_iters: int, steps_per_iter: int
) -> tuple[Any, dict[str, jax.Array]]:
    """The fused chunk before in-place buffer writes (commit bfd2835^), for the 'before' rows."""

    def body(carry: tuple[Any, jax.Array], _: Any) -> tuple[Any, Any]:
        states, step = carry
        if jax.tree.leaves(states)[0].shape[0] == 1:
            state, out = iteration(jax.tree.map(lambda x: x[0], states), step)
            new_states, out = jax.tree.map(lambda x: x[None], (state, out))
        else:
            new_states, out = jax.vmap(iteration, in_axes=(0, None))(states, step)
        states = jax.tree.map(
            lambda n, o: jax.lax.convert_element_type(n, o.dtype), new_states, states
        )
        return (states, step + steps_per_iter), out

    (states, _), (infos, sums, count) = jax.lax.scan(body, (states, step), None, length=num_iters)
    metrics = {k: v[-1] for k, v in infos.items()}
    metrics["sum:train/episode_return"] = sums["train/episode_return"].sum(0)
    metrics["train/episodes"] = count.sum(0)
    metrics[NONFINITE] = states.nonfinite
    return states, metrics


def ms_per_iteration(
    part: str, chunk: str, num_envs: int, capacity: int, iters: int, calls: int = 3
) -> float:
    """Median milliseconds per iteration of a compiled chunk of ``iters`` iterations."""
    spec = registry.get("sac")
    cfg = spec.config(buffer_size=capacity, learning_starts=0)
    env = make_jax_env("jax:pendulum", num_envs)
    if part == "full":
        iteration = partial(_off_policy_iteration, env=env, num_updates=1)
    else:
        iteration = partial(_partial_iteration, env=env, part=part)
    if chunk == "after":
        run = jit_chunk(iteration, iters, num_envs)
    else:
        body = partial(_chunk_before, iteration=iteration, num_iters=iters, steps_per_iter=num_envs)
        run = jax.jit(body, donate_argnums=0)
    seeds = jnp.zeros(1, jnp.int32)
    states = jax.jit(jax.vmap(lambda s: init_fused_state(spec, cfg, env, s)))(seeds)
    step = jnp.int32(0)
    states, _ = run(states, step)  # compile, and fill the first rows
    jax.block_until_ready(states)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        states, _ = run(states, step)
        jax.block_until_ready(states)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)) / iters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", choices=["before", "after"], action="append")
    p.add_argument("--capacity", type=int, action="append")
    p.add_argument("--iters", type=int, default=200, help="iterations per timed call (1 env)")
    args = p.parse_args()
    chunks = args.chunk or ["before", "after"]
    capacities = args.capacity or [10_000, 1_000_000]
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__}
    res: dict[str, Any] = {"machine": machine, "rows": []}
    settings = [(1, part, args.iters) for part in PARTS] + [(64, "full", max(args.iters // 4, 1))]
    for num_envs, part, iters in settings:
        for chunk in chunks:
            for capacity in capacities:
                ms = ms_per_iteration(part, chunk, num_envs, capacity, iters)
                row = {"envs": num_envs, "part": part, "chunk": chunk, "capacity": capacity}
                res["rows"].append({**row, "ms_per_iteration": ms})
                print(f"{row}: {ms:.3f} ms/iteration", flush=True)
    write(res, chunks, capacities)


def write(res: dict, chunks: list[str], capacities: list[int]) -> None:
    """``profile_fused.{json,md}``: one row per (envs, part), one column per (chunk, capacity)."""
    with open(RESULTS + ".json", "w") as f:
        json.dump(res, f, indent=2)
    cell = {(r["envs"], r["part"], r["chunk"], r["capacity"]): r for r in res["rows"]}
    cols = [(c, cap) for c in chunks for cap in capacities]
    head = " | ".join(f"{c}, {cap:,} rows" for c, cap in cols)
    lines = [
        "# Fused loop: milliseconds per iteration, by part",
        "",
        "SAC (256, 256), batch 256, 1 update per iteration, `jax:pendulum`. Each row adds one part "
        "of the iteration to the one above (env: random actions; +act: the policy's; +add: the "
        "replay-buffer write; full: plus sampling and the update). 'before' is the chunk as it was "
        "before buffer writes were made in place, 'after' the loop's current chunk (`jit_chunk`). "
        "Median of 3 timed calls, compilation excluded.",
        "",
        f"| envs | part | {head} |",
        "|---|---|" + "---|" * len(cols),
    ]
    for envs, part in dict.fromkeys((r["envs"], r["part"]) for r in res["rows"]):
        vals = [cell.get((envs, part, c, cap)) for c, cap in cols]
        cells = " | ".join(f"{v['ms_per_iteration']:.3f}" if v else "-" for v in vals)
        lines.append(f"| {envs} | {part} | {cells} |")
    lines += ["", "Regenerate: `.venv/bin/python benchmarks/profile_fused.py`", ""]
    with open(RESULTS + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
