"""Time per update against updates per call: the host loop's per-call cost, in one run.

The host loop dispatches one update call per env step. This measures ms per update of the host
loop's update (``jaxrl.loops.host._learn``, rows drawn on the host, 1M-row buffer holding 100k
rows) at K = 1, 2, 4 and 50 updates per call, for SAC and TD3 (or ``--agents``) at their
defaults on HalfCheetah-sized inputs (obs 17, act 6). Calls are dispatched back to back, so the
device queue never drains. Two rounds, alternating K. Each agent is measured with the agent
donated to the jitted call and without (``--donate both``, the default), or only as the host
loop compiles it on this backend (``--donate loop``, ``jaxrl.loops.host.learn_donation``).

Usage:
    .venv/bin/python benchmarks/updates_per_call.py [--rounds 2] [--agents sac td3 crossq]

Writes benchmarks/results/updates_per_call.md and updates_per_call.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.buffers import make_replay_buffer
from jaxrl.loops.host import _learn, learn_donation
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS, ACT, ROWS, KS = 17, 6, 100_000, (1, 2, 4, 50)


def _setup(name: str) -> tuple:
    spec = registry.get(name)
    cfg = spec.config()
    agent = spec.agent.create(cfg, jnp.zeros(OBS), jnp.zeros(ACT), 0)
    rng = np.random.default_rng(0)
    data = Transition(
        rng.normal(size=(ROWS, OBS)).astype(np.float32),
        rng.uniform(-1, 1, (ROWS, ACT)).astype(np.float32),
        rng.normal(size=ROWS).astype(np.float32),
        rng.normal(size=(ROWS, OBS)).astype(np.float32),
        np.zeros(ROWS, np.float32),
    )
    buf = make_replay_buffer(cfg.buffer_size)
    state = buf.add(buf.init(jax.tree.map(lambda x: x[0], data)), data)
    return agent, state, cfg.batch_size, rng


def ms_per_update(name: str, rounds: int, donate: tuple[int, ...]) -> dict[int, list[float]]:
    """Milliseconds per update at each K, one figure per round (``donate``: donated arguments)."""
    agent, buffer, batch, rng = _setup(name)
    learn = jax.jit(_learn, donate_argnums=donate)
    box = {"agent": agent, "bad": jnp.zeros((), jnp.int32)}

    def call(rows: np.ndarray) -> None:
        box["agent"], box["bad"], _ = learn(box["agent"], box["bad"], buffer, None, rows, None)

    out: dict[int, list[float]] = {k: [] for k in KS}
    for _ in range(rounds):
        for k in KS:
            calls = max(400 // k, 10)
            rows = [rng.integers(0, ROWS, (k, batch), dtype=np.int32) for _ in range(calls + 1)]
            call(rows[0])  # compiles for this K
            jax.block_until_ready(box["agent"])
            start = time.perf_counter()
            for r in rows[1:]:
                call(r)
            jax.block_until_ready(box["agent"])
            out[k].append(1e3 * (time.perf_counter() - start) / (calls * k))
            print(f"{name} K={k}: {out[k][-1]:.3f} ms/update", flush=True)
    return out


def main() -> None:
    """Measure the agents and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--agents", nargs="+", default=["sac", "td3"], help="registry names")
    p.add_argument(
        "--donate",
        choices=["both", "loop"],
        default="both",
        help="measure donated and undonated calls, or only the host loop's choice",
    )
    args = p.parse_args()
    loop = learn_donation()
    variants = {"donated": (0, 1), "not donated": ()} if args.donate == "both" else {"": loop}
    results = {}
    for name in args.agents:
        for label, donate in variants.items():
            mark = " (host loop)" if donate == loop else ""
            row = f"{name}, {label}{mark}" if label else name
            results[row] = ms_per_update(name, args.rounds, donate)
    lines = [
        "# Time per update against updates per call (host loop's update)",
        "",
        f"Machine: {os.cpu_count()} CPUs, jax {jax.__version__}. `_learn` with rows drawn on the "
        f"host, 1M-row buffer holding {ROWS:,} rows, paper defaults, calls back to back; "
        "median over rounds (each round's figure in brackets).",
        "",
        "| agent | " + " | ".join(f"K={k}: ms/update" for k in KS) + " | K=1 over K=50 |",
        "|---|" + "---|" * (len(KS) + 1),
    ]
    for name, res in results.items():
        med = {k: float(np.median(v)) for k, v in res.items()}
        cells = [f"{med[k]:.2f} ({', '.join(f'{x:.2f}' for x in res[k])})" for k in KS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {med[1] / med[50]:.2f} |")
    agents = " ".join(args.agents)
    lines += [
        "",
        f"Regenerate: `.venv/bin/python benchmarks/updates_per_call.py --agents {agents} "
        f"--donate {args.donate}`",
        "",
    ]
    out = os.path.join(ROOT, "benchmarks", "results", "updates_per_call")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
