"""Throughput of SAC and TD3 at paper defaults on HalfCheetah-v5 (obs 17, act 6).

Measures, in one run on this machine:
  1. the fp32 matmul peak (a large jitted matmul), for the FLOPs-based efficiency figure;
  2. updates/s of the fused update alone (K updates per call under lax.scan, 256x256 MLPs,
     batch 256), with XLA's FLOP count per update and the fraction of the measured peak; and
     with one update per call, as the host loop dispatches them (its ceiling);
  3. end-to-end env-steps/s of `jaxrl train` (host loop, 1 update per env step, 1M buffer),
     timed after learning starts and after the first 1,000 updates (compilation excluded), and
     its ratio to the fused update rate;
  4. the same end-to-end figure for Stable-Baselines-Jax SAC (sbx-rl) in its own virtualenv
     (`make peers` creates it; pass --no-peers to skip).

Usage:
    .venv/bin/python benchmarks/throughput.py [--steps 7000] [--no-peers]

Writes benchmarks/results/throughput.md and throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.agents import td3 as td3_lib
from jaxrl.buffers import make_replay_buffer
from jaxrl.loops import TrainConfig
from jaxrl.loops.device import update_step
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS, ACT, BATCH = 17, 6, 256


def _flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost.get("flops", 0.0))


def matmul_peak(n: int = 2048, reps: int = 10) -> float:
    """Best GFLOP/s of an n x n x n fp32 matmul."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def update_rate(name: str, k: int = 50, calls: int = 10) -> dict:
    """Updates/s of K fused updates per call, sampling from a filled 100k-row device buffer."""
    agent_cls, config_cls = registry.get(name).agent, registry.get(name).config
    cfg = config_cls()
    agent = agent_cls.create(cfg, jnp.zeros(OBS), jnp.zeros(ACT), 0)
    rng = np.random.default_rng(0)
    n = 100_000
    data = Transition(
        rng.normal(size=(n, OBS)).astype(np.float32),
        rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
        rng.normal(size=n).astype(np.float32),
        rng.normal(size=(n, OBS)).astype(np.float32),
        np.zeros(n, np.float32),
    )
    buf = make_replay_buffer(n)
    state = buf.add(buf.init(jax.tree.map(lambda x: x[0], data)), data)
    step = jax.jit(partial(update_step, num_updates=k, batch_size=BATCH), donate_argnums=(0, 1))
    key = jax.random.key(1)
    agent, key, _ = step(agent, key, state, None)
    jax.block_until_ready(agent)
    t = time.perf_counter()
    for _ in range(calls):
        agent, key, _ = step(agent, key, state, None)
    jax.block_until_ready(agent)
    rate = k * calls / (time.perf_counter() - t)

    fresh = agent_cls.create(cfg, jnp.zeros(OBS), jnp.zeros(ACT), 0)
    batch = jax.tree.map(lambda x: jnp.asarray(x[:BATCH]), data)
    if name == "td3":  # the actor step runs every `policy_delay` updates
        critic = _flops(
            lambda a, b: jax.grad(td3_lib.critic_loss, has_aux=True)(
                a.critic.params, a, b, jax.random.key(0)
            ),
            fresh,
            batch,
        )
        actor = _flops(
            lambda a, b: jax.grad(td3_lib.actor_loss, has_aux=True)(a.actor.params, a, b),
            fresh,
            batch,
        )
        flops = critic + actor / cfg.policy_delay
    else:
        flops = _flops(lambda a, b: a.update(b), fresh, batch)
    return {"updates_per_s": rate, "gflop_per_update": flops / 1e9}


def end_to_end(name: str, steps: int, learning_starts: int, warmup: int) -> float:
    """Env-steps/s of `jaxrl train NAME` on HalfCheetah-v5 over the timed window."""
    config_cls = registry.get(name).config
    cfg = config_cls(learning_starts=learning_starts)
    with tempfile.TemporaryDirectory() as out:
        run = TrainConfig(
            env="HalfCheetah-v5",
            total_steps=steps,
            out=out,
            eval_every=steps,
            eval_episodes=1,
            log_every=500,
            progress=False,
            tensorboard=False,
            checkpoint_every=steps,
        )
        train(name, run, cfg)
        rows = read_metrics(os.path.join(out, "metrics.csv"))
    start = learning_starts + warmup
    timed = [(r["step"], r["time/env_steps_per_s"]) for r in rows if r["step"] > start]
    prev = [start] + [s for s, _ in timed[:-1]]
    n_steps = sum(s - p for (s, _), p in zip(timed, prev, strict=True))
    seconds = sum((s - p) / rate for (s, rate), p in zip(timed, prev, strict=True))
    return n_steps / seconds


def sbx_rate(steps: int, learning_starts: int, warmup: int) -> dict | None:
    """Run the sbx peer in .venv-peers (created by `make peers`); None if unavailable."""
    python = os.path.join(ROOT, ".venv-peers", "bin", "python")
    if not os.path.exists(python):
        print("sbx peer venv missing: run `make peers` first (skipping sbx)", file=sys.stderr)
        return None
    cmd = [
        python,
        os.path.join(ROOT, "benchmarks", "peers", "sbx_sac.py"),
        "--steps",
        str(steps),
        "--learning-starts",
        str(learning_starts),
        "--warmup",
        str(warmup),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=7000, help="env steps per end-to-end run")
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=1000, help="updates excluded from timing")
    p.add_argument("--no-peers", action="store_true", help="skip the sbx comparison")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating jaxrl/sbx SAC end-to-end runs (medians are reported)",
    )
    args = p.parse_args()

    res: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "device": str(jax.devices()[0]),
        },
        "settings": "256x256 MLPs, batch 256, 1 update per env step, 1M buffer, HalfCheetah-v5",
    }
    res["matmul_peak_gflops"] = matmul_peak()
    print(f"matmul peak: {res['matmul_peak_gflops']:.1f} GFLOP/s", flush=True)
    # Every round measures the update rates next to the end-to-end runs, and the runs alternate
    # between jaxrl and sbx, so that all figures see the same machine load (medians reported).
    fused = {n: {"updates_per_s": [], "updates_per_s_one_per_call": []} for n in ("sac", "td3")}
    e2e = {"sac": [], "td3": [], "sbx": []}
    for r in range(args.rounds):
        for name in ("sac", "td3"):
            u = update_rate(name)
            res[name] = {"gflop_per_update": u["gflop_per_update"]}
            fused[name]["updates_per_s"].append(u["updates_per_s"])
            # One update per call, as the host loop dispatches them: its ceiling here.
            one = update_rate(name, k=1, calls=500)["updates_per_s"]
            fused[name]["updates_per_s_one_per_call"].append(one)
            e2e[name].append(end_to_end(name, args.steps, args.learning_starts, args.warmup))
            print(
                f"round {r} {name}: fused {u['updates_per_s']:.1f} updates/s, one per call "
                f"{one:.1f}, end to end {e2e[name][-1]:.1f} env-steps/s",
                flush=True,
            )
        if not args.no_peers:
            peer = sbx_rate(args.steps, args.learning_starts, args.warmup)
            if peer is not None:
                res["sbx_sac"] = peer
                e2e["sbx"].append(peer["env_steps_per_s"])
                print(f"sbx SAC end-to-end: {peer['env_steps_per_s']:.1f} env-steps/s", flush=True)
    for name in ("sac", "td3"):
        u = res[name]
        for key, runs in fused[name].items():
            u[key], u[key + "_runs"] = float(np.median(runs)), runs
        u["gflops"] = u["updates_per_s"] * u["gflop_per_update"]
        u["peak_fraction"] = u["gflops"] / res["matmul_peak_gflops"]
        u["env_steps_per_s"] = float(np.median(e2e[name]))
        u["env_steps_per_s_runs"] = e2e[name]
        u["end_to_end_over_fused_runs"] = [
            e / f for e, f in zip(e2e[name], fused[name]["updates_per_s"], strict=True)
        ]
    if e2e["sbx"]:
        res["sbx_sac"]["env_steps_per_s"] = float(np.median(e2e["sbx"]))
        res["sbx_sac"]["env_steps_per_s_runs"] = e2e["sbx"]
    write_tables(res)


def _runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.0f}" for x in xs)


def write_tables(res: dict) -> None:
    """Write results/throughput.{json,md}."""
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "throughput.json"), "w") as f:
        json.dump(res, f, indent=2)
    sbx = res.get("sbx_sac")
    notes: list[str] = []
    lines = [
        "# Throughput: SAC and TD3 on HalfCheetah-v5",
        "",
        f"Machine: {res['machine']['cpus']} CPUs, {res['machine']['device']}, jax "
        f"{res['machine']['jax']}. Settings: {res['settings']}.",
        f"Measured fp32 matmul peak (2048^3): **{res['matmul_peak_gflops']:.0f} GFLOP/s**.",
        "",
        "'of fused': the end-to-end rate over the fused update rate (1 update per env step). "
        "'1 update per call': the update rate when each call runs one update, as the host loop "
        "dispatches them.",
        "",
        "| agent | fused updates/s | GFLOP/update | GFLOP/s | % of peak | 1 update per call "
        "| end-to-end env-steps/s | of fused |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("sac", "td3"):
        u = res[name]
        e = u["env_steps_per_s"]
        notes.append(
            f"{name.upper()} per round: fused {_runs(u['updates_per_s_runs'])}; one per call "
            f"{_runs(u['updates_per_s_one_per_call_runs'])}; end to end "
            f"{_runs(u['env_steps_per_s_runs'])}; end to end / fused "
            + ", ".join(f"{x:.2f}" for x in u["end_to_end_over_fused_runs"])
            + "."
        )
        lines.append(
            f"| jaxrl {name.upper()} | {u['updates_per_s']:.0f} | {u['gflop_per_update']:.3f} | "
            f"{u['gflops']:.0f} | {100 * u['peak_fraction']:.0f}% | "
            f"{u['updates_per_s_one_per_call']:.0f} | {e:.0f} | {e / u['updates_per_s']:.2f} |"
        )
    if sbx:
        lines.append(
            f"| sbx-rl {sbx['sbx_version']} SAC | - | - | - | - | - | "
            f"{sbx['env_steps_per_s']:.0f} | |"
        )
    lines += ["", *notes]
    if sbx:
        lines += [
            "",
            f"End-to-end figures are medians of alternating runs (jaxrl SAC: "
            f"{_runs(res['sac']['env_steps_per_s_runs'])}; sbx SAC: "
            f"{_runs(sbx['env_steps_per_s_runs'])} env-steps/s), each timed after "
            "learning_starts + 1,000 updates so that compilation is excluded.",
            "",
            f"jaxrl SAC / sbx SAC end-to-end: "
            f"**{res['sac']['env_steps_per_s'] / sbx['env_steps_per_s']:.2f}x** (the ceiling, "
            f"jaxrl's fused update rate over sbx's end to end, is "
            f"{res['sac']['updates_per_s'] / sbx['env_steps_per_s']:.2f}x)",
        ]
    lines += ["", "Regenerate: `make peers && .venv/bin/python benchmarks/throughput.py`", ""]
    with open(os.path.join(ROOT, "benchmarks", "results", "throughput.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
