"""What PRDC's nearest-row search costs: time per update against TD3+BC's, at 1M dataset rows.

PRDC is TD3+BC with the BC target replaced by the action of the nearest dataset row, found by an
exact brute-force search over all rows inside the jitted actor step (``DatasetRows.nearest``).
This measures, on hopper-sized synthetic data (obs 11, action 3, ``--rows`` rows, default 1M),
at paper defaults (batch 256, 256x256 networks, policy delay 2):

* ``update``: ms per ``agent.update`` (minibatch sampling included), ``--updates`` updates
  scanned per call, so the average is over critic-only and actor steps alike;
* ``actor step``: ms per actor gradient step alone (TD3+BC's loss against PRDC's, search
  included), scanned the same way;
* ``search``: ms per nearest-row search of one minibatch alone, and its arithmetic rate
  (``2 * batch * rows * (obs + action)`` FLOP per search).

Calls run back to back after one compiling call; the median over ``--rounds`` is reported.

Usage:
    .venv/bin/python benchmarks/prdc_cost.py [--rows 1000000] [--updates 100] [--rounds 3]

Writes benchmarks/results/prdc_cost.md and prdc_cost.json (``--out`` changes the base name).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import networks as nets
from jaxrl.buffers import buffer_from_arrays, buffer_sample
from jaxrl.offline import prdc, td3_bc
from jaxrl.offline.common import DatasetRows
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS, ACT = 11, 3  # Hopper


def machine() -> dict:
    """CPU model, cores, OS, jax version and the current load."""
    cpu = platform.processor() or "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":")[1].strip() for ln in f if ln.startswith("model name")), cpu)
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "load_avg_1min_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _data(rows: int) -> Transition:
    rng = np.random.default_rng(0)
    return Transition(
        rng.normal(size=(rows, OBS)).astype(np.float32),
        rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
        rng.normal(size=rows).astype(np.float32),
        rng.normal(size=(rows, OBS)).astype(np.float32),
        np.zeros(rows, np.float32),
    )


@partial(jax.jit, static_argnames=("num",), donate_argnums=(0,))
def _updates(agent, key, num: int, buffer):
    def body(agent, k):
        return agent.update(buffer_sample(buffer, k, agent.config.batch_size))[0], None

    return jax.lax.scan(body, agent, jax.random.split(key, num))[0]


@partial(jax.jit, static_argnames=("num", "loss"), donate_argnums=(0,))
def _actor_steps(agent, key, num: int, buffer, loss: Callable):
    def body(agent, k):
        batch = agent.norm.batch(buffer_sample(buffer, k, agent.config.batch_size))
        actor, _ = nets.gradient_step(agent.actor, loss, agent, batch)
        return agent.replace(actor=actor), None

    return jax.lax.scan(body, agent, jax.random.split(key, num))[0]


@partial(jax.jit, static_argnames=("num",))
def _searches(agent, key, num: int, buffer):
    def body(total, k):
        batch = buffer_sample(buffer, k, agent.config.batch_size)
        idx, dist = agent.rows.nearest(
            batch.obs, batch.action, agent.hparams["beta"], agent.config.chunk_size
        )
        return total + dist.sum() + idx.sum(), None

    return jax.lax.scan(body, jnp.float32(0), jax.random.split(key, num))[0]


def _ms_per_step(run: Callable, state, num: int, calls: int, carry: bool) -> float:
    """Milliseconds per scanned step: one compiling call, then ``calls`` calls back to back.

    ``carry``: each call returns the next call's ``state`` (an agent, donated to the call).
    """
    key = jax.random.key(1)
    out = jax.block_until_ready(run(state, key, num))
    state = out if carry else state
    start = time.perf_counter()
    for i in range(calls):
        out = run(state, jax.random.fold_in(key, i + 1), num)
        state = out if carry else state
    jax.block_until_ready(out)
    return 1e3 * (time.perf_counter() - start) / (calls * num)


def measure(rows: int, num: int, calls: int, rounds: int) -> dict:
    """Milliseconds per update, actor step and search (TD3+BC, PRDC), one figure per round."""
    data = _data(rows)
    buffer = buffer_from_arrays(data)
    obs, act = jnp.zeros(OBS), jnp.zeros(ACT)
    table = {
        "rows": rows,
        "batch_size": prdc.PRDCConfig().batch_size,
        "chunk_size": prdc.PRDCConfig().chunk_size,
        "rows_mb": rows * (OBS + ACT + 2) * 4 / 1e6,
    }

    def fresh(name):
        if name == "td3-bc":
            return td3_bc.TD3BC.create(td3_bc.TD3BCConfig(), obs, act, 0)
        agent = prdc.PRDC.create(prdc.PRDCConfig(), obs, act, 0)
        return agent.replace(rows=DatasetRows.from_arrays(data.obs, data.action))

    losses = {"td3-bc": td3_bc.actor_loss, "prdc": prdc.actor_loss}
    for name in ("td3-bc", "prdc"):
        table[name] = {"update_ms": [], "actor_step_ms": []}
        for _ in range(rounds):
            ms = _ms_per_step(partial(_updates, buffer=buffer), fresh(name), num, calls, True)
            table[name]["update_ms"].append(ms)
            step = partial(_actor_steps, buffer=buffer, loss=losses[name])
            ms = _ms_per_step(step, fresh(name), num, calls, True)
            table[name]["actor_step_ms"].append(ms)
            print(f"{name}: {table[name]}", flush=True)
    agent = fresh("prdc")
    table["search_ms"] = [
        _ms_per_step(partial(_searches, buffer=buffer), agent, num, calls, False)
        for _ in range(rounds)
    ]
    flop = 2.0 * table["batch_size"] * rows * (OBS + ACT)
    table["search_gflop_per_s"] = flop / (np.median(table["search_ms"]) * 1e-3) / 1e9
    print(f"search: {table['search_ms']} ms", flush=True)
    return table


def _cell(values: list[float]) -> str:
    return f"{np.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})"


def report(table: dict, meta: dict, args: argparse.Namespace) -> str:
    """The markdown table."""
    med = {n: {k: float(np.median(v)) for k, v in table[n].items()} for n in ("td3-bc", "prdc")}
    lines = [
        "# PRDC's nearest-row search: cost per update against TD3+BC",
        "",
        f"Machine: {meta['cpu']}, {meta['cores']} cores, {meta['platform']}, jax {meta['jax']} "
        f"({meta['device']}); 1-min load average {meta['load_avg_1min_start']:.1f} at the start, "
        f"{meta['load_avg_1min_end']:.1f} at the end; {meta['date']}.",
        "",
        f"Hopper-sized synthetic data: {table['rows']:,} rows (obs {OBS}, action {ACT}; the "
        f"rows PRDC keeps on the device: {table['rows_mb']:.0f} MB), paper defaults (batch "
        f"{table['batch_size']}, 256x256, policy delay 2), search chunk {table['chunk_size']} "
        f"rows. {args.updates} steps scanned per call, {args.calls} calls per round; median "
        f"over {args.rounds} rounds (each round's figure in brackets).",
        "",
        "| agent | ms per update (critic + actor every 2nd) | ms per actor step |",
        "|---|---|---|",
    ]
    for name in ("td3-bc", "prdc"):
        t = table[name]
        lines.append(f"| {name} | {_cell(t['update_ms'])} | {_cell(t['actor_step_ms'])} |")
    lines += [
        f"| PRDC / TD3+BC | {med['prdc']['update_ms'] / med['td3-bc']['update_ms']:.1f}x | "
        f"{med['prdc']['actor_step_ms'] / med['td3-bc']['actor_step_ms']:.1f}x |",
        "",
        f"The search alone: {_cell(table['search_ms'])} ms per minibatch, "
        f"{table['search_gflop_per_s']:.0f} GFLOP/s (2 x batch x rows x (obs + action) FLOP).",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/prdc_cost.py --rows {table['rows']}`",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Measure and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="dataset rows")
    p.add_argument("--updates", type=int, default=100, help="steps scanned per call")
    p.add_argument("--calls", type=int, default=5, help="timed calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--out", default="prdc_cost", help="base name under benchmarks/results/ (or a path)"
    )
    args = p.parse_args()
    meta = machine()
    table = measure(args.rows, args.updates, args.calls, args.rounds)
    meta["load_avg_1min_end"] = os.getloadavg()[0]
    text = report(table, meta, args)
    out = os.path.join(ROOT, "benchmarks", "results", args.out)
    with open(out + ".md", "w") as f:
        f.write(text)
    with open(out + ".json", "w") as f:
        json.dump({"machine": meta, **table}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
