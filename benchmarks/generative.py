"""Generative offline agents: training speed and action latency beside Gaussian IQL.

For IQL (Gaussian actor, the baseline), IDQL, Diffusion-QL and FQL at their paper defaults
(jaxrl's config defaults, ``max_steps=1_000_000`` where the config has it), measured in one run on
this machine, on 100k random transitions shaped like HalfCheetah (17-dim observations, 6-dim
actions in [-1, 1]) held in device arrays:

* training updates/s: K updates per jitted call fused in one loop (a minibatch of the config's
  ``batch_size`` drawn with ``jax.random.randint`` inside each step, the agent donated). K is a
  traced argument, so each agent compiles once; a probe call sizes K so that one call takes about
  ``--call-seconds``. Compilation and warm-up are excluded; the figure is the median over
  ``--repeats`` calls. GFLOP/update is XLA's cost analysis of that compiled loop, which counts its
  body (one minibatch draw and one update) once whatever K is.
* action latency of ``eval_actions`` and ``sample_actions`` (with a key) for one observation
  ``[17]`` and for a batch ``[256, 17]``: the policy jitted with the trained agent closed over, so
  only the host numpy observation goes in (as a robot's control loop calls an exported policy),
  timed call by call until ``block_until_ready`` returns, dispatch included; median and 90th
  percentile. jaxrl's own loops pass the agent as an argument instead; that single-observation
  latency is in the JSON as ``eval_1_agent_arg``.

The target checked: FQL's one-step policy acts within 2x the latency of IQL's Gaussian actor,
for one observation and for a batch of 256.

Usage:
    .venv/bin/python benchmarks/generative.py [--agents iql,idql,diffusion-ql,fql]
        [--repeats 5] [--quick] [--out benchmarks/results]

``--quick`` is a smoke run (2 repeats, ~1 s calls, fewer latency calls). Writes
``generative.md`` and ``generative.json`` into ``--out`` and prints the table. The default run
takes about 4 minutes on 2 cores, ``--quick`` under 3 (IDQL's batch-256 action selection alone
is seconds per call).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTS = ("iql", "idql", "diffusion-ql", "fql", "fql-actor-2x256")
# Variants beside the paper defaults: FQL with the Gaussian actor's network size (2 x 256), to
# separate the cost of the one-step policy from the cost of the paper's larger network.
VARIANTS = {"fql-actor-2x256": ("fql", {"actor_hidden_dims": (256, 256)})}
BASELINE = "iql"
OBS, ACT, ROWS = 17, 6, 100_000
MAX_STEPS = 1_000_000
TARGET_RATIO = 2.0
# Settings shown in the table when an agent's config has them: what sets the cost of a step.
SHOWN = (
    "hidden_dims",
    "actor_hidden_dims",
    "critic_hidden_dims",
    "actor_architecture",
    "diffusion_steps",
    "flow_steps",
    "num_samples",
    "num_qs",
)


# ------------------------------------------------------------------------------------------ data


def synthetic_data(with_next_action: bool, seed: int = 0) -> Transition:
    """``ROWS`` random HalfCheetah-shaped transitions as float32 device arrays."""
    rng = np.random.default_rng(seed)

    def dev(x: np.ndarray) -> jax.Array:
        return jnp.asarray(x, jnp.float32)

    return Transition(
        obs=dev(rng.normal(size=(ROWS, OBS))),
        action=dev(rng.uniform(-1, 1, (ROWS, ACT))),
        reward=dev(rng.normal(size=ROWS)),
        next_obs=dev(rng.normal(size=(ROWS, OBS))),
        terminal=dev(rng.random(ROWS) < 0.001),
        next_action=dev(rng.uniform(-1, 1, (ROWS, ACT))) if with_next_action else None,
    )


def paper_config(config_cls: type) -> Any:
    """The config's defaults, with a 1M-step horizon for configs that schedule over one."""
    cfg = config_cls()
    if any(f.name == "max_steps" for f in dataclasses.fields(cfg)):
        cfg = dataclasses.replace(cfg, max_steps=MAX_STEPS)
    return cfg


# -------------------------------------------------------------------------------------- training


def fused_updates(
    agent: Any, data: Transition, key: jax.Array, k: jax.Array, *, batch_size: int
) -> tuple[Any, dict, jax.Array]:
    """``k`` updates on minibatches drawn from ``data``; the agent, the last info, a fresh key.

    ``k`` is traced (the loop is a ``fori_loop`` with a dynamic trip count), so one compilation
    serves the probe call and the timed calls.
    """
    rows = data.obs.shape[0]
    key, sub = jax.random.split(key)

    def step(a: Any, kk: jax.Array) -> tuple[Any, dict]:
        idx = jax.random.randint(kk, (batch_size,), 0, rows)
        return a.update(jax.tree.map(lambda x: x[idx], data))

    # The info is carried (not dropped) so that XLA cannot prune the work behind it.
    shapes = jax.eval_shape(step, agent, sub)[1]
    info = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    agent, info = jax.lax.fori_loop(
        0, k, lambda i, c: step(c[0], jax.random.fold_in(sub, i)), (agent, info)
    )
    return agent, info, key


def _flops(compiled: Any) -> float:
    """XLA's FLOP count of a lowered or compiled computation (NaN when it reports none)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get("flops", float("nan")))


def _two_digits(x: float) -> int:
    """``x`` rounded to two significant digits, at least 1 (K values that read well)."""
    if x < 10:
        return max(1, round(x))
    scale = 10 ** (len(str(int(x))) - 2)
    return int(round(x / scale) * scale)


def train_rate(
    agent: Any, cfg: Any, data: Transition, repeats: int, call_s: float
) -> tuple[dict, Any]:
    """Updates/s of the fused update of ``agent``; the result and the trained agent."""
    bs = int(cfg.batch_size)
    fn = jax.jit(partial(fused_updates, batch_size=bs), donate_argnums=0)
    key = jax.random.key(1)
    t = time.perf_counter()
    compiled = fn.lower(agent, data, key, jnp.int32(1)).compile()
    compile_s = time.perf_counter() - t
    gflop = _flops(compiled) / 1e9

    def call(agent: Any, key: jax.Array, k: int) -> tuple[Any, dict, jax.Array, float]:
        t = time.perf_counter()
        agent, info, key = compiled(agent, data, key, jnp.int32(k))
        jax.block_until_ready((agent, info))
        return agent, info, key, time.perf_counter() - t

    agent, info, key, first_s = call(agent, key, 1)
    # Probe: grow k until a call is long enough to time, then size K for `call_s` per call.
    k = 1
    while True:
        agent, info, key, dt = call(agent, key, k)
        if dt >= 0.25 or k >= 4096:
            break
        k *= 4
    k_final = _two_digits(call_s * k / dt)
    times = []
    for _ in range(repeats):
        agent, info, key, dt = call(agent, key, k_final)
        times.append(dt)
    rates = [k_final / t for t in times]
    finite = all(bool(np.isfinite(np.asarray(v)).all()) for v in jax.tree.leaves(info))
    return {
        "updates_per_s": round(float(np.median(rates)), 2),
        "updates_per_s_runs": [round(r, 2) for r in rates],
        "updates_per_call": k_final,
        "call_s_median": round(float(np.median(times)), 2),
        "compile_s": round(compile_s, 1),
        "first_call_s": round(first_s, 2),
        "batch_size": bs,
        "gflop_per_update": round(gflop, 3),
        "gflop_per_s": round(gflop * float(np.median(rates)), 1),
        "losses_finite": finite,
    }, agent


# --------------------------------------------------------------------------------------- latency


def latency(fn: Any, args: tuple, max_calls: int, budget_s: float, min_calls: int) -> dict:
    """Median / p90 microseconds of ``fn(*args)`` until ready, compile and warm-up excluded.

    Calls are timed one by one, up to ``max_calls`` or until ``budget_s`` has passed (but at
    least ``min_calls``), so that seconds-long calls (IDQL's 256 x 64 candidates) stay affordable.
    """
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first_s = time.perf_counter() - t
    for _ in range(3 if first_s < 1.0 else 1):
        jax.block_until_ready(fn(*args))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_calls and (
        len(times) < min_calls or time.perf_counter() - start < budget_s
    ):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    us = np.asarray(times) * 1e6
    return {
        "median_us": round(float(np.median(us)), 1),
        "p90_us": round(float(np.percentile(us, 90)), 1),
        "calls": len(times),
        "compile_and_first_call_s": round(first_s, 2),
    }


def action_latencies(agent: Any, obs: np.ndarray, max_calls: int, budget_s: float) -> dict:
    """Latency of ``eval_actions`` / ``sample_actions`` on 1 and 256 host observations."""
    one, batch = obs[0], obs[:256]
    key = jax.random.key(2)
    eval_fn = jax.jit(lambda o: agent.eval_actions(o))
    sample_fn = jax.jit(lambda o, k: agent.sample_actions(o, k))
    arg_fn = jax.jit(lambda a, o: a.eval_actions(o))
    out = {}
    for label, x in (("1", one), ("256", batch)):
        out[f"eval_{label}"] = latency(eval_fn, (x,), max_calls, budget_s, 3)
        out[f"eval_{label}"]["mflop"] = round(_flops(eval_fn.lower(x)) / 1e6, 3)
        out[f"sample_{label}"] = latency(sample_fn, (x, key), max_calls, budget_s, 3)
    out["eval_1_agent_arg"] = latency(arg_fn, (agent, one), max_calls, budget_s, 3)
    return out


# ------------------------------------------------------------------------------------------ main


def settings(cfg: Any) -> str:
    """A one-line description of the settings that set the cost of an update or an action."""
    parts = []
    for name in SHOWN:
        if hasattr(cfg, name):
            v = getattr(cfg, name)
            parts.append(f"{name}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}")
    return ", ".join(parts)


def measure(name: str, args: argparse.Namespace) -> dict:
    """Training speed and action latencies of one agent at its paper defaults."""
    base, overrides = VARIANTS.get(name, (name, {}))
    agent_cls, config_cls = registry.get(base).agent, registry.get(base).config
    cfg = dataclasses.replace(paper_config(config_cls), **overrides)
    data = synthetic_data(bool(getattr(cfg, "needs_next_action", False)))
    agent = agent_cls.create(cfg, data.obs[0], data.action[0], 0)
    train, agent = train_rate(agent, cfg, data, args.repeats, args.call_seconds)
    print(
        f"{name}: {train['updates_per_s']:.1f} updates/s (K={train['updates_per_call']}, "
        f"{train['gflop_per_update']:.2f} GFLOP/update, compile {train['compile_s']} s)",
        flush=True,
    )
    obs = np.asarray(data.obs[:256])
    lat = action_latencies(agent, obs, args.max_calls, args.latency_seconds)
    print(
        f"{name}: eval {lat['eval_1']['median_us']:,.0f} us (1 obs), "
        f"{lat['eval_256']['median_us']:,.0f} us (256 obs)",
        flush=True,
    )
    cfg_json = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    return {"agent": name, "settings": settings(cfg), **train, **lat, "config": cfg_json}


def add_ratios(rows: list[dict]) -> dict | None:
    """Eval latency relative to IQL's per row; the FQL target verdict (None without both)."""
    base = next((r for r in rows if r["agent"] == BASELINE), None)
    for r in rows:
        for n in ("1", "256"):
            b = base[f"eval_{n}"]["median_us"] if base else None
            r[f"eval_ratio_{n}"] = round(r[f"eval_{n}"]["median_us"] / b, 2) if b else None
    fql = next((r for r in rows if r["agent"] == "fql"), None)
    if base is None or fql is None:
        return None
    return {
        f"{k}_{n}": v
        for n in ("1", "256")
        for k, v in (
            ("fql_over_iql", fql[f"eval_ratio_{n}"]),
            ("within_2x", fql[f"eval_ratio_{n}"] <= TARGET_RATIO),
        )
    }


def _us(c: dict) -> str:
    return f"{c['median_us']:,.0f} ({c['p90_us']:,.0f})"


def verdict_lines(target: dict | None) -> list[str]:
    """The acceptance check in words."""
    if target is None:
        return ["FQL target not checked: it needs both iql and fql in --agents."]
    return [
        f"Target, FQL's eval latency within {TARGET_RATIO:g}x of IQL's: "
        f"1 obs {target['fql_over_iql_1']:.2f}x -> "
        f"{'MET' if target['within_2x_1'] else 'NOT MET'}; "
        f"256 obs {target['fql_over_iql_256']:.2f}x -> "
        f"{'MET' if target['within_2x_256'] else 'NOT MET'}."
    ]


def write_tables(res: dict, out: str) -> None:
    """Print the table and write generative.{md,json} into ``out``."""
    m = res["machine"]
    lines = [
        "# Generative offline agents: updates/s and action latency beside Gaussian IQL",
        "",
        f"Machine: `{m['devices']}` ({m['cpus']} CPUs, {m['platform']}), jax {m['jax']}. "
        f"1-min load average {m['load_average_start']} before and "
        f"{m['load_average_end']} after the run (other processes; near 0 on a quiet machine)."
        + (" **Quick (smoke) run: few repeats and calls.**" if res["quick"] else ""),
        "",
        f"Data: {ROWS:,} random transitions (obs {OBS}, act {ACT} in [-1, 1]) in device arrays. "
        f"Agents at paper defaults (config defaults, max_steps={MAX_STEPS:,} where present).",
        "",
        "| agent | batch | updates/s | K | GFLOP/update | eval 1 obs, us | eval 256 obs, us "
        "| sample 1 obs, us | sample 256 obs, us | eval / IQL (1 / 256) | eval MFLOP (1 / 256) "
        "| settings |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["results"]:
        ratio = "-"
        if r["eval_ratio_1"] is not None:
            ratio = f"{r['eval_ratio_1']:.2f}x / {r['eval_ratio_256']:.2f}x"
        lines.append(
            f"| {r['agent']} | {r['batch_size']} | {r['updates_per_s']:,.1f} | "
            f"{r['updates_per_call']} | {r['gflop_per_update']:.2f} | {_us(r['eval_1'])} | "
            f"{_us(r['eval_256'])} | {_us(r['sample_1'])} | {_us(r['sample_256'])} | {ratio} | "
            f"{r['eval_1']['mflop']:.3g} / {r['eval_256']['mflop']:,.0f} | {r['settings']} |"
        )
    lines += [
        "",
        *verdict_lines(res["target"]),
        "",
        f"- updates/s: median of {res['repeats']} calls of K updates fused in one jitted loop "
        "(minibatches drawn on the device, agent donated), compile and warm-up excluded; K is "
        f"sized for about {res['call_seconds']:g} s per call. GFLOP/update: XLA's cost analysis "
        "of the compiled loop body (one minibatch draw and one update).",
        "- Latency: median (p90) in microseconds of single calls of the jitted policy with the "
        "trained agent closed over, from a host numpy observation to `block_until_ready`, "
        "dispatch included; `sample` passes a key. Eval MFLOP: XLA's estimate for one call. "
        "IDQL and Diffusion-QL draw candidate actions at eval too (noise seeded per observation).",
        "- With the agent passed as an argument on every call instead (as jaxrl's evaluation "
        "loops do; its pytree is flattened per call), eval on 1 obs takes "
        + ", ".join(f"{r['agent']} {_us(r['eval_1_agent_arg'])}" for r in res["results"])
        + " us.",
        "",
        "Regenerate: `.venv/bin/python benchmarks/generative.py` (a few minutes; `--quick` for a "
        "smoke run).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "generative.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(out, "generative.md"), "w") as f:
        f.write(text)
    print(f"wrote {out}/generative.md and generative.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default=",".join(AGENTS), help="comma-separated offline agents")
    p.add_argument("--repeats", type=int, default=None, help="timed training calls (default 5)")
    p.add_argument("--call-seconds", type=float, default=None, help="target seconds per call")
    p.add_argument("--max-calls", type=int, default=None, help="most timed calls per latency")
    p.add_argument("--latency-seconds", type=float, default=None, help="time per latency case")
    p.add_argument("--quick", action="store_true", help="smoke run: fewer repeats and calls")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    quick = {"repeats": 2, "call_seconds": 1.0, "max_calls": 200, "latency_seconds": 0.5}
    full = {"repeats": 5, "call_seconds": 2.0, "max_calls": 1000, "latency_seconds": 3.0}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    names = [n.strip() for n in args.agents.split(",") if n.strip()]
    offline = registry.names("offline")
    unknown = [n for n in names if n not in offline and n not in VARIANTS]
    if unknown:
        known = ", ".join([*offline, *VARIANTS])
        raise SystemExit(f"unknown agent(s) {unknown}; choose from {known}")

    threads = len(os.sched_getaffinity(0))
    load_start = os.getloadavg()[0]
    if load_start > 0.5 * threads:
        print(
            f"warning: load average {load_start:.1f} on {threads} cores; other processes will "
            "skew the figures",
            file=sys.stderr,
        )
    t0 = time.perf_counter()
    rows = [measure(name, args) for name in names]
    target = add_ratios(rows)
    res = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "devices": str(jax.devices()),
            "cpus": os.cpu_count(),
            "threads": threads,
            "platform": platform.platform(),
            "jax": jax.__version__,
            "load_average_start": round(load_start, 2),
            "load_average_end": round(os.getloadavg()[0], 2),
        },
        "quick": args.quick,
        "repeats": args.repeats,
        "call_seconds": args.call_seconds,
        "latency_max_calls": args.max_calls,
        "latency_seconds": args.latency_seconds,
        "data": f"{ROWS} random transitions, obs {OBS}, act {ACT}",
        "wall_clock_s": round(time.perf_counter() - t0, 1),
        "target": target,
        "results": rows,
    }
    write_tables(res, args.out)


if __name__ == "__main__":
    main()
