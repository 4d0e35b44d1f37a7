"""Where one env step of the host loop spends its time (issue 15's profile, host side).

Runs `jaxrl train` (SAC or TD3, paper defaults, HalfCheetah-v5, 1 env, 1 update per step) twice
under ``cProfile``, for ``--steps`` and ``--steps + --extra`` env steps, and reports the
difference per env step: compilation, warm-up and the first updates cancel, what remains is the
steady state. The host loop's parts are the methods it calls once per step:

- ``HostEnv.step``: the MuJoCo step through Gymnasium's vector env;
- ``_Host.action``: the next action, i.e. waiting for the previous call's result (the device's
  update + act) and copying it to the host;
- ``_Host.store``: writing the transition into the device buffer (a jitted ``buffer_add``);
- ``_Host.end_step``, ``Harness.advance``: episode bookkeeping, counters, the progress bar;
- ``Harness.log``/``save``: log points (metrics fetch, evaluation) and checkpoints;
- the rest of the loop body: the update call itself (argument flattening, dispatch).

``cProfile`` sees host time only; the device's work shows where the host waits for it
(``_Host.action``). Its per-call overhead inflates the many small Python calls a little, so
read the split, not the absolute rate (``benchmarks/throughput.py`` measures that).

Both orderings of the loop are profiled, one column each: exact (the update, then the next
action from the updated parameters: the env step waits for the update; the loop before issue
15) and overlapped (``--overlap``: the next action from the parameters before the update
dispatched in the same step, so the env step and the transition write run during the update).

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
from jaxrl.cli import train
from jaxrl.loops import TrainConfig

WAIT = "wait for the device's update + act, copy the action"
REST = "update call (flatten, dispatch) and the rest of the loop body"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PARTS = {  # (file suffix, function name) -> part
    ("envs/gym.py", "step"): "env step (MuJoCo via Gymnasium)",
    ("loops/host.py", "action"): WAIT,
    ("loops/host.py", "store"): "transition into the device buffer",
    ("loops/host.py", "end_step"): "episode bookkeeping",
    ("loops/harness.py", "advance"): "counters, cadence, progress bar",
    ("loops/harness.py", "log"): "log points (metrics fetch, evaluation)",
    ("loops/harness.py", "save"): "checkpoints",
    ("loops/host.py", "train_host"): "total",
}


def profile(
    agent: str, steps: int, learning_starts: int, overlap: bool
) -> tuple[dict[str, float], float]:
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
            overlap=overlap,
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
    from jaxrl.loops.host import _act, _update_counted, init_loop_state

    spec = registry.get(agent_name)
    env = make_env("HalfCheetah-v5")
    obs = env.reset(seed=0)
    agent = spec.agent.create(spec.config(), env.obs_example, env.action_example, 0)
    state = init_loop_state(spec, agent, env, 0)
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
    act, key = jax.jit(_act), jax.random.key(2)
    costs["policy action: call, run, copy to host"] = _per_call_ms(
        lambda: np.asarray(act(agent, obs, key, 0)), 2000
    )
    ident = jax.jit(lambda a: a)
    costs["a jitted call taking the agent (pytree flattening, dispatch)"] = _per_call_ms(
        lambda: ident(agent), 2000, jax.block_until_ready
    )
    update = jax.jit(
        partial(_update_counted, num_updates=1, batch_size=spec.config().batch_size),
        donate_argnums=(0, 1, 2),
    )
    loop = {"agent": agent, "rng": jax.random.key(1), "bad": jnp.zeros((), jnp.int32)}

    def step(wait: bool) -> Any:
        out = update(loop["agent"], loop["rng"], loop["bad"], box["buffer"], None)
        loop["agent"], loop["rng"], loop["bad"], _ = out
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
    args = parser.parse_args()

    cols, walls = {}, {}
    for mode, overlap in (("exact", False), ("overlapped", True)):
        short, wall_short = profile(args.agent, args.steps, args.learning_starts, overlap)
        long, wall_long = profile(
            args.agent, args.steps + args.extra, args.learning_starts, overlap
        )
        per_step = {k: 1e3 * (long[k] - short[k]) / args.extra for k in short}
        total = per_step.pop("total")
        per_step[REST] = total - sum(per_step.values())
        per_step["total"] = total
        cols[mode], walls[mode] = per_step, (wall_short, wall_long)
    isolated = isolated_costs(args.agent)
    exact, over = cols["exact"], cols["overlapped"]
    parts = sorted((k for k in exact if k != "total"), key=lambda k: -exact[k])
    lines = [
        f"# Host loop profile: {args.agent.upper()} on HalfCheetah-v5 (paper defaults, 1 env, "
        "1 update per step)",
        "",
        f"`benchmarks/profile_host.py --agent {args.agent} --steps {args.steps} --extra "
        f"{args.extra}`: host time per env step under cProfile, the difference of a "
        f"{args.steps + args.extra:,}- and a {args.steps:,}-step run (learning starts at "
        f"{args.learning_starts:,}), in each ordering of the loop. Exact: the order before "
        "issue 15 (the env step waits for the update). Overlapped (`--overlap`): the env step "
        "and the transition write run while the device updates. cProfile adds per-call "
        "overhead; read the split.",
        "",
        "| part | exact: ms per env step | share | overlapped: ms per env step | share |",
        "|---|---|---|---|---|",
        *[
            f"| {k} | {exact[k]:.2f} | {exact[k] / exact['total']:.0%} | "
            f"{over[k]:.2f} | {over[k] / over['total']:.0%} |"
            for k in parts
        ],
        f"| **one env step** | **{exact['total']:.2f}** | 100% | "
        f"**{cols['overlapped']['total']:.2f}** | 100% |",
        "",
        "Wall clock under the profiler: "
        + "; ".join(
            f"{mode} {a:.1f} s and {b:.1f} s ({args.extra / (b - a):.0f} env-steps/s in between)"
            for mode, (a, b) in walls.items()
        )
        + ". A part near zero can come out slightly negative: it is a difference of two runs.",
        "",
        "In the exact order the env step, the transition write and the update call come after "
        "the wait for step t's action and before update t is dispatched, so the device idles "
        "during them. Overlapped, the wait is for the policy's action (which the device computes "
        "before the update dispatched with it) and that host work runs while the device updates.",
        "",
        "Each piece of per-step work timed alone, without the profiler (mean ms per call):",
        "",
        "| piece | ms |",
        "|---|---|",
        *[f"| {k} | {v:.3f} |" for k, v in isolated.items()],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    name = os.path.join(RESULTS, f"profile_host_{args.agent}")
    with open(name + ".md", "w") as f:
        f.write(text)
    with open(name + ".json", "w") as f:
        json.dump({"args": vars(args), "ms_per_step": cols, "isolated_ms": isolated}, f, indent=1)


if __name__ == "__main__":
    main()
