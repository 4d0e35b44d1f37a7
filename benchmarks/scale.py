"""Training over several devices: the collectives of the compiled programs, and a GPU model.

This machine has no GPU, so the scaling figures are a model, not a measurement. What is
measured comes from the programs XLA compiles for N devices, here forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set by this script):

1. **One update, data-parallel** (SAC 256x256, TD3, IQL, CQL at batch 256, and PPO on a
   64-env rollout, with HalfCheetah's sizes: obs 17, act 6): the minibatch is split over the
   data axis and the agent is whole on every device. For each: the all-reduces in the compiled
   program and their bytes, the bytes of the networks trained (what a gradient all-reduce must
   carry), other collectives, and the FLOPs of one update on one device (``cost_analysis``).
2. **One fused-loop iteration, data-parallel** (act, step, store, update), for SAC and for PPO
   with its observation normalizer, on ``jax:pendulum`` with 64 envs.
3. **A member-sharded sweep**: 4 SAC members on 4 devices, one chunk of the fused loop.

The model: one update on N devices takes ``F / (N R) + k a + 2 (N - 1) / N * B / W``, with F the
update's FLOPs, R the effective compute rate of one GPU, k the number of all-reduces, a the
latency of one, B their bytes and W the link bandwidth of a ring all-reduce (the
bandwidth term of NCCL's ring algorithm). The efficiency is ``t(1) / (N t(N))`` at a fixed
global batch (strong scaling). R and a are stated assumptions; W comes from NVIDIA's datasheet.

Usage:
    .venv/bin/python benchmarks/scale.py [--devices 4] [--out benchmarks/results] [--json F]

Writes benchmarks/results/scale.md and scale.json (``--json F``: only the JSON, to F).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4, help="forced CPU devices")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--json", default=None, help="write only this JSON file")
    p.add_argument("--agents", nargs="*", default=["sac", "td3", "iql", "cql", "ppo"])
    p.add_argument(
        "--quick",
        action="store_true",
        help="the test's programs: SAC and IQL updates, a PPO iteration, a member-sharded sweep",
    )
    return p.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:  # before JAX starts: the number of CPU devices is fixed then
    flag = f"--xla_force_host_platform_device_count={ARGS.devices}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402

from jaxrl import registry  # noqa: E402
from jaxrl.envs.jax_envs import make_jax_env  # noqa: E402
from jaxrl.loops.config import TrainConfig  # noqa: E402
from jaxrl.loops.device import guarded_update, strongly_typed  # noqa: E402
from jaxrl.loops.fused import _iteration, init_fused_state, jit_chunk, state_shardings  # noqa: E402
from jaxrl.loops.mesh import collectives, make_layout  # noqa: E402
from jaxrl.types import Rollout, Transition  # noqa: E402

OBS, ACT, BATCH, ENVS = 17, 6, 256, 64

# Links between the GPUs of one node, from NVIDIA's A100 datasheet (nvidia.com, "NVIDIA A100
# Tensor Core GPU" datasheet): NVLink 600 GB/s per GPU (both directions), PCIe Gen4 64 GB/s
# (both directions). A ring all-reduce sends and receives at once: one direction's share.
LINKS = {"NVLink (A100, 300 GB/s each way)": 300e9, "PCIe Gen4 x16 (32 GB/s each way)": 32e9}
RATE = 5e12
"""Assumed effective fp32 rate of one GPU on these small MLPs (FLOP/s): a quarter of an A100's
19.5 TFLOP/s fp32 peak (its datasheet), since 256-wide layers at batch 256 do not fill it."""
LATENCY = 20e-6
"""Assumed latency of one all-reduce inside a node (s): NCCL's small-message figure."""


def _bytes(tree) -> int:
    return int(sum(np.size(x) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _trained_bytes(agent) -> int:
    """Bytes of the parameters of every network the agent trains (its TrainStates)."""
    states = jax.tree.leaves(agent, is_leaf=lambda x: isinstance(x, TrainState))
    return sum(_bytes(s.params) for s in states if isinstance(s, TrainState))


def _example(spec, agent):
    """A minibatch (off-policy, offline) or a 64-env rollout (on-policy) of the right shapes."""
    key = jax.random.key(0)
    if spec.kind == "on-policy":
        steps = agent.config.rollout_length(ENVS)
        obs = jax.random.normal(key, (steps, ENVS, OBS))
        _, extras = jax.vmap(agent.policy_step, in_axes=(0, None))(obs, key)
        z = jnp.zeros((steps, ENVS))
        act = jnp.tanh(extras["raw_action"])
        return Rollout(obs, act, extras, z, z, z, obs), 1
    obs = jax.random.normal(key, (BATCH, OBS))
    act = jnp.zeros((BATCH, ACT))
    batch = Transition(obs, act, jnp.zeros(BATCH), obs, jnp.zeros(BATCH))
    fields = {}
    if spec.needs_next_action:
        fields["next_action"] = act
    if spec.needs_mc_return:
        fields["mc_return"] = jnp.zeros(BATCH)
    return (batch._replace(**fields) if fields else batch), 0


def update_program(name: str, devices: int, flops: bool = True) -> dict:
    """Collectives and FLOPs (unless ``flops=False``) of one data-parallel update of ``name``."""
    spec = registry.get(name)
    agent = spec.agent.create(spec.config(), jnp.zeros(OBS), jnp.zeros(ACT), 0)
    batch, axis = _example(spec, agent)
    update = jax.jit(lambda a, b: guarded_update(a, b))
    cost = update.lower(agent, batch).compile().cost_analysis() if flops else {}
    cost = cost[0] if isinstance(cost, list) else cost
    layout = make_layout(devices, 1)
    agent = layout.place(agent, layout.sharding())
    batch = layout.place(batch, layout.sharding(*([None] * axis), "data"))
    with layout.active():
        text = update.lower(agent, batch).compile().as_text()
    found = collectives(text)
    cfg = agent.config
    steps = cfg.num_updates_per_batch * cfg.num_minibatches if spec.kind == "on-policy" else 1
    return {
        "agent": name,
        "optimizer_steps": steps,
        "flops": float(cost.get("flops", 0.0)),
        "trained_bytes": _trained_bytes(agent),
        "all_reduce_bytes": found["all-reduce"],
        "other": {k: v for k, v in found.items() if k != "all-reduce" and v},
    }


def iteration_program(name: str, devices: int, members: int = 1) -> dict:
    """Collectives of a two-iteration chunk of the fused loop, ``members`` members.

    One member is data-parallel. Each op of the iteration counts once (it is a loop body).
    """
    spec = registry.get(name)
    normalize = spec.env_obs_norm
    env = make_jax_env("jax:pendulum", ENVS, normalize_obs=normalize)
    cfg = TrainConfig(env="jax:pendulum", num_envs=ENVS)
    extra = {} if spec.kind == "on-policy" else {"buffer_size": ENVS * 100}
    agent_config = spec.config(**extra)
    iteration, unit, _ = _iteration(spec, agent_config, env, cfg)
    seeds = jnp.arange(members, dtype=jnp.int32)
    init = jax.jit(jax.vmap(lambda s: init_fused_state(spec, agent_config, env, s)))
    states = strongly_typed(init(seeds))
    layout = make_layout(devices, members)
    shardings = state_shardings(layout, states, ENVS)
    states = layout.place(states, shardings)
    with layout.active():
        chunk = jit_chunk(iteration, 2, unit, shardings)
        text = chunk.lower(states, jnp.int32(10**6)).compile().as_text()
    found = collectives(text)
    return {
        "agent": name,
        "members": members,
        "mesh": {"members": layout.members, "data": layout.data},
        "normalizer": normalize,
        "trained_bytes": _trained_bytes(states.agent) // members,
        "collectives": {k: v for k, v in found.items() if v},
        # How the replay buffer's rows and the env copies are placed (PartitionSpec).
        "buffer_spec": None
        if states.buffer is None
        else str(jax.tree.leaves(shardings.buffer)[0].spec),
        "env_spec": str(shardings.env.obs.spec),
    }


def model(update: dict, devices: int, bandwidth: float) -> float:
    """Predicted strong-scaling efficiency of ``update`` on ``devices`` GPUs."""

    def time(n: int) -> float:
        if n == 1:
            return update["flops"] / RATE
        volume = sum(update["all_reduce_bytes"])
        step = len(update["all_reduce_bytes"]) * LATENCY + 2 * (n - 1) / n * volume / bandwidth
        gathered = sum(sum(v) for v in update["other"].values())  # PPO's rollout, once
        comm = update["optimizer_steps"] * step + (n - 1) / n * gathered / bandwidth
        return update["flops"] / (n * RATE) + comm

    return time(1) / (devices * time(devices))


def _kb(values: list[int]) -> str:
    return " + ".join(f"{v / 1e3:,.1f}" for v in values) or "-"


def report(result: dict) -> str:
    """The markdown page."""
    n = result["devices"]
    lines = [
        "# Training over several devices: collectives and a scaling model",
        "",
        "Written by `benchmarks/scale.py` from programs compiled for "
        f"{n} forced CPU devices (jax {result['jax']}). Collectives are counted in the compiled "
        "HLO text: an op inside a loop body (`lax.scan`) is counted once. Rerun with "
        "`.venv/bin/python benchmarks/scale.py`.",
        "",
        f"## One update, data-parallel over {n} devices (obs {OBS}, act {ACT})",
        "",
        "Off-policy and offline agents: a minibatch of "
        f"{BATCH} rows split over the devices. PPO: one update on a {ENVS}-env rollout "
        "(its epochs x minibatches are a loop of optimizer steps: each all-reduce in the table "
        "runs once per step; the all-gathers assemble the rollout once, since each minibatch "
        "draws its segments from every device's envs). The gradient all-reduces should carry "
        "the trained networks' bytes and little more (losses, and batch statistics such as "
        "TD3+BC's mean |Q|).",
        "",
        "| agent | optimizer steps | GFLOP / update (1 device) | networks trained (kB) | "
        "all-reduces per step | bytes all-reduced per step (kB) | other collectives |",
        "|---|---|---|---|---|---|---|",
    ]
    for u in result["updates"]:
        other = ", ".join(f"{k}: {len(v)} ({sum(v) / 1e3:,.1f} kB)" for k, v in u["other"].items())
        lines.append(
            f"| {u['agent']} | {u['optimizer_steps']} | {u['flops'] / 1e9:.3f} | "
            f"{u['trained_bytes'] / 1e3:,.1f} | {len(u['all_reduce_bytes'])} | "
            f"{_kb(u['all_reduce_bytes'])} | {other or '-'} |"
        )
    lines += [
        "",
        "## One fused-loop iteration",
        "",
        "| agent | members | mesh (members x data) | observation normalizer | collectives "
        "(count: kB each) |",
        "|---|---|---|---|---|",
    ]
    for it in result["iterations"]:
        found = "; ".join(f"{k} {len(v)}: {_kb(v)}" for k, v in it["collectives"].items())
        mesh = f"{it['mesh']['members']} x {it['mesh']['data']}"
        lines.append(
            f"| {it['agent']} | {it['members']} | {mesh} | {it['normalizer']} | {found or 'none'} |"
        )
    lines += [
        "",
        "## Predicted efficiency on GPUs (a model, not a measurement)",
        "",
        f"Assumed: {RATE / 1e12:.0f} TFLOP/s effective per GPU, {LATENCY * 1e6:.0f} µs per "
        "all-reduce. Links from NVIDIA's A100 datasheet. Efficiency = t(1) / (N t(N)) at a "
        "fixed global batch.",
        "",
        "| agent | link | 1 | 2 | 4 | 8 |",
        "|---|---|---|---|---|---|",
    ]
    for u in result["updates"]:
        for link, w in LINKS.items():
            cells = " | ".join(f"{model(u, d, w):.2f}" for d in (1, 2, 4, 8))
            lines.append(f"| {u['agent']} | {link} | {cells} |")
    lines += [
        "",
        "At batch 256 an update is too small to split well: the all-reduce latency is of the "
        "order of the compute. PPO here has 64 envs, so each of its 64 optimizer steps is about "
        "0.01 GFLOP against 5 all-reduces: latency is all of its time on several GPUs. Its "
        "minibatches grow with the envs (4096 envs: 64 times the work per step, the same "
        "all-reduces), which is where data parallelism pays off, as with large batches and "
        "networks. Seeds and settings (`--num-seeds`, `jaxrl sweep`) spread over devices with "
        "no communication at all.",
        "",
    ]
    return "\n".join(lines)


def main() -> dict:
    """Compile the programs, print and write the tables."""
    n = ARGS.devices
    agents = ["sac", "iql"] if ARGS.quick else ARGS.agents
    iterations = [("ppo", 1), ("sac", n), ("sac", 1)]
    result = {
        "devices": n,
        "jax": jax.__version__,
        "updates": [update_program(a, n, flops=not ARGS.quick) for a in agents],
        "iterations": [iteration_program(a, n, members=m) for a, m in iterations],
    }
    text = json.dumps(result, indent=1)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            f.write(text)
        return result
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "scale.json"), "w") as f:
        f.write(text)
    page = report(result)
    with open(os.path.join(ARGS.out, "scale.md"), "w") as f:
        f.write(page)
    print(page)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
