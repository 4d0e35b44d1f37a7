"""Where one env step of the host loop spends its time (the host side).

Runs `jaxrl train` (SAC or TD3, paper defaults, HalfCheetah-v5, 1 env, 1 update per step) twice
under ``cProfile``, for ``--steps`` and ``--steps + --extra`` env steps, and reports the
difference per env step: compilation, warm-up and the first updates cancel, what remains is the
steady state. The host loop's parts are the methods it calls once per step:

- ``HostEnv.step``: the MuJoCo step through Gymnasium's vector env;
- ``HostState.action``: the next action, i.e. waiting for the previous call's result (the device's
  update + act) and copying it to the host;
- ``HostState.store``: writing the transition into the device buffer (a jitted ``buffer_add``);
- ``HostState.end_step``, ``Harness.advance``: episode bookkeeping, counters, the progress bar;
- ``Harness.log``/``save``: log points (metrics fetch, evaluation) and checkpoints;
- the rest of the loop body: the update call itself (argument flattening, dispatch).

``cProfile`` sees host time only; the device's work shows where the host waits for it
(``HostState.action``). Its per-call overhead inflates the many small Python calls a little, so
read the split, not the absolute rate (``benchmarks/throughput.py`` measures that).

Run it on two checkouts for a before/after table: the columns of ``--compare FILE`` (an
earlier run's JSON, e.g. of an older loop) are shown beside this run's.

Usage:
    .venv/bin/python benchmarks/profile_host.py [--agent sac] [--steps 2000] [--extra 2000]

Writes benchmarks/results/profile_host_AGENT.md and .json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from functools import partial
from typing import Any

from jaxrl import registry
from jaxrl.loops import TrainConfig
from jaxrl.run import train

WAIT = "wait for the device's update + act, copy the action"
REST = "update call (flatten, dispatch) and the rest of the loop body"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PARTS = {  # (file suffix, function name) -> part
    ("envs/gym.py", "step"): "env step (MuJoCo via Gymnasium)",
    ("loops/host_state.py", "action"): WAIT,
    ("loops/host_state.py", "store"): "transition into the device buffer",
    ("loops/host_state.py", "end_step"): "episode bookkeeping",
    ("loops/harness.py", "advance"): "counters, cadence, progress bar",
    ("loops/harness.py", "log"): "log points (metrics fetch, evaluation)",
    ("loops/harness.py", "save"): "checkpoints",
    ("loops/host.py", "train_host"): "total",
}


def profile(agent: str, steps: int, learning_starts: int) -> tuple[dict[str, float], float]:
    """Cumulative host seconds per part of one ``jaxrl train`` run, and its wall clock."""
    spec = registry.get(agent)
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            env="HalfCheetah-v5",
            total_steps=steps,
            seed=0,
            eval_every=10**9,
            log_every=1000,
            progress=True,
            tensorboard=False,
            out=out,
        )
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.runcall(train, agent, cfg, spec.config(learning_starts=learning_starts))
        wall = time.perf_counter() - start
    seconds = dict.fromkeys(PARTS.values(), 0.0)
    for (path, _, name), row in pstats.Stats(prof).stats.items():
        for (suffix, fn), part in PARTS.items():
            if name == fn and path.endswith(suffix):
                seconds[part] += row[3]  # cumulative time
    return seconds, wall


def _per_call_ms(fn: Any, calls: int, sync: Any = None) -> float:
    """Mean milliseconds of ``fn()`` over ``calls`` calls (``sync(result)`` waits for it)."""
    result = fn()
    if sync:
        sync(result)
    start = time.perf_counter()
    for _ in range(calls):
        result = fn()
    if sync:
        sync(result)
    return 1e3 * (time.perf_counter() - start) / calls


def isolated_costs(agent_name: str) -> dict[str, float]:
    """Each piece of per-step host work timed alone (no profiler), in ms per call."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tqdm import tqdm

    from jaxrl.buffers import buffer_add
    from jaxrl.envs import make_env
    from jaxrl.loops.acting import acting
    from jaxrl.loops.host import _act, _learn, init_loop_state

    spec = registry.get(agent_name)
    env = make_env("HalfCheetah-v5")
    obs = env.reset(seed=0)
    agent = spec.agent.create(spec.config(), env.obs_example, env.action_example, 0)
    state = init_loop_state(spec, agent, env)
    zero = np.zeros((1, env.action_dim), np.float32)
    row = jax.tree.map(lambda x: np.zeros((1, *x.shape[1:]), x.dtype), state.buffer.data)
    buffer = buffer_add(state.buffer, row)  # one valid row to sample from
    costs = {"env step (MuJoCo via Gymnasium, 1 env)": _per_call_ms(lambda: env.step(zero), 2000)}
    add = jax.jit(buffer_add, donate_argnums=0)
    box = {"buffer": buffer}

    def write() -> Any:
        box["buffer"] = add(box["buffer"], row)
        return box["buffer"]

    costs["transition write (dispatch of the jitted add)"] = _per_call_ms(write, 2000)
    act, key = jax.jit(partial(_act, explore=acting(spec).explore)), jax.random.key(2)
    first = np.ones(env.num_envs, bool)
    costs["policy action: call, run, copy to host"] = _per_call_ms(
        lambda: np.asarray(act(agent, state.plan, obs, first, key, 0)[0]), 2000
    )
    ident = jax.jit(lambda a: a)
    costs["a jitted call taking the agent (pytree flattening, dispatch)"] = _per_call_ms(
        lambda: ident(agent), 2000, jax.block_until_ready
    )
    learn = jax.jit(_learn, donate_argnums=(0, 1))
    rows = np.zeros((1, spec.config().batch_size), np.int32)
    loop = {"agent": agent, "bad": jnp.zeros((), jnp.int32)}

    def step(wait: bool) -> Any:
        out = learn(loop["agent"], loop["bad"], box["buffer"], None, rows, None)
        loop["agent"], loop["bad"], _ = out
        if wait:
            jax.block_until_ready(loop["agent"])
        return loop["agent"]

    step(True)
    costs["update call, returning before the update ran (dispatch)"] = _dispatch_ms(
        lambda: step(False), loop
    )
    costs["one update per call, run to completion (device)"] = _per_call_ms(
        lambda: step(False), 300, jax.block_until_ready
    )
    bar = tqdm(total=10**9, disable=False, file=open(os.devnull, "w"))
    costs["progress bar update"] = _per_call_ms(lambda: bar.update(1), 20000)
    env.close()
    return costs


def _dispatch_ms(call: Any, loop: dict, calls: int = 50) -> float:
    """Host time until ``call()`` returns, each call after the device went idle."""
    import jax

    total = 0.0
    for _ in range(calls):
        jax.block_until_ready(loop["agent"])
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
    jax.block_until_ready(loop["agent"])
    return 1e3 * total / calls


def main() -> None:
    """Profile two run lengths and write the per-step difference as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="sac", choices=["sac", "td3"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--extra", type=int, default=2000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--compare", help="an earlier run's JSON to show beside this run")
    parser.add_argument("--compare-label", default="before")
    parser.add_argument("--no-isolated", action="store_true", help="only the profiled runs")
    args = parser.parse_args()

    short, wall_short = profile(args.agent, args.steps, args.learning_starts)
    long, wall_long = profile(args.agent, args.steps + args.extra, args.learning_starts)
    per_step = {k: 1e3 * (long[k] - short[k]) / args.extra for k in short}
    total = per_step.pop("total")
    per_step[REST] = total - sum(per_step.values())
    per_step["total"] = total
    isolated = {} if args.no_isolated else isolated_costs(args.agent)
    cols = {"this run": {"ms_per_step": per_step, "isolated_ms": isolated}}
    if args.compare:
        with open(args.compare) as f:
            cols = {args.compare_label: json.load(f), **cols}
    parts = sorted((k for k in per_step if k != "total"), key=lambda k: -per_step[k])
    head = " | ".join(f"{c}: ms | share" for c in cols)
    lines = [
        f"# Host loop profile: {args.agent.upper()} on HalfCheetah-v5 (paper defaults, 1 env, "
        "1 update per step)",
        "",
        f"`benchmarks/profile_host.py --agent {args.agent} --steps {args.steps} --extra "
        f"{args.extra}`: host time per env step under cProfile, the difference of a "
        f"{args.steps + args.extra:,}- and a {args.steps:,}-step run (learning starts at "
        f"{args.learning_starts:,}). cProfile adds per-call overhead; read the split.",
        "",
        f"| part | {head} |",
        "|---|" + "---|---|" * len(cols),
    ]
    for k in [*parts, "total"]:
        cells = []
        for c in cols.values():
            ms = c["ms_per_step"].get(k, float("nan"))
            cells.append(f"{ms:.2f} | {ms / c['ms_per_step']['total']:.0%}")
        name = "**one env step**" if k == "total" else k
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Wall clock under the profiler (this run): {wall_short:.1f} s and {wall_long:.1f} s "
        f"({args.extra / (wall_long - wall_short):.0f} env-steps/s in between). A part near zero "
        "can come out slightly negative: it is a difference of two runs.",
        "",
        "Each piece of per-step work timed alone, without the profiler (mean ms per call):",
        "",
        f"| piece | {' | '.join(cols)} |",
        "|---|" + "---|" * len(cols),
    ]
    for k in isolated or cols.get(args.compare_label, {}).get("isolated_ms", {}):
        cells = [f"{c.get('isolated_ms', {}).get(k, float('nan')):.3f}" for c in cols.values()]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    name = os.path.join(RESULTS, f"profile_host_{args.agent}")
    with open(name + ".md", "w") as f:
        f.write(text)
    with open(name + ".json", "w") as f:
        json.dump({"args": vars(args), **cols["this run"]}, f, indent=1)


if __name__ == "__main__":
    main()
