"""Offline learning run of d3rlpy (BC, TD3+BC, CQL, IQL, PRDC) on D4RL HDF5, in a jaxrl run dir.

Run inside the peer virtualenv created by ``setup_peers.sh`` (``make peers``)::

    .venv-peers/bin/python benchmarks/peers/suite_d3rlpy.py --algo iql \
        --dataset hopper-medium.hdf5 --env Hopper-v5 --steps 1000000 \
        --out runs/d3rlpy-iql-s0 --seed 0 --eval-every 10000 --eval-episodes 10

The jaxrl config (paper defaults, or ``--config`` JSON of jaxrl field values) is translated to
d3rlpy's by ``d3rlpy_offline.make_config``, which also lists what d3rlpy cannot match
(``settings.unmatched`` in ``config.json``). The dataset is read by
``d3rlpy_offline.load_dataset``. Training runs ``algo.fit`` in chunks of ``--eval-every``
gradient steps; after each chunk the deterministic policy (``algo.predict``) plays
``--eval-episodes`` episodes of ``--env`` (Gymnasium) and a checkpoint is written
(``save_model``: networks, optimizers and learning-rate schedulers).

Files written: ``config.json``, ``metrics.csv``, ``summary.json`` and ``checkpoints/`` (see
``rundir.py``); the summary is printed as one JSON line. The normalized score uses the
``ref_min_return`` / ``ref_max_return`` in the file's ``metadata`` (group entries or attributes)
or root attributes, else D4RL's references for the env's family (Hopper, HalfCheetah, ...).

Resume: a directory with ``summary.json`` is finished (printed, exit 0). Otherwise the latest
checkpoint is loaded with ``load_model``, the gradient-step counter is set to its step, and
training continues to the same total. The scalers (observation/reward normalization) are not in
d3rlpy's model file; they are fitted again from the same dataset, which gives the same values,
and so is PRDC's nearest-neighbour index (``d3rlpy_offline.fit_neighbours``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

import d3rlpy
import gymnasium as gym
import h5py
import numpy as np
import rundir
import structlog
import torch
from d3rlpy.algos.utility import build_scalers_with_transition_picker
from d3rlpy.logging import NoopAdapterFactory
from d3rlpy_offline import AGENTS, PAPER_DEFAULTS, fit_neighbours, load_dataset, make_config


def dataset_refs(path: str, env_id: str) -> tuple[tuple[float, float] | None, str]:
    """Reference returns for the normalized score and where they came from.

    Args:
        path: the HDF5 file; its ``metadata`` group (entries or attributes) or root attributes
            may hold ``ref_min_return`` and ``ref_max_return`` (as jaxrl writes them).
        env_id: the evaluation env; D4RL's references of its family are the fallback.
    """
    found: dict[str, float] = {}
    with h5py.File(path, "r") as h:
        places = [h.attrs]
        if "metadata" in h:
            places = [h["metadata"], h["metadata"].attrs, h.attrs]
        for place in places:
            for key in ("ref_min_return", "ref_max_return"):
                if key in place and key not in found:
                    value = place[key]
                    found[key] = float(value[()] if hasattr(value, "shape") else value)
    if len(found) == 2:
        return (found["ref_min_return"], found["ref_max_return"]), "dataset metadata"
    refs = rundir.gymnasium_refs(env_id)
    return refs, ("D4RL constants of the env's family" if refs else "none")


def describe(value: Any) -> Any:
    """A JSON-able view of a d3rlpy config: nested factories and scalers as ``{type, fields}``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"type": value.get_type()} if hasattr(value, "get_type") else {}
        for f in dataclasses.fields(value):
            out[f.name] = describe(getattr(value, f.name))
        return out
    if isinstance(value, list | tuple):
        return [describe(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return repr(value)


def evaluate(algo, env: gym.Env, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std of the undiscounted return of ``episodes`` deterministic episodes."""
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            action = algo.predict(np.asarray(obs, np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


def main() -> None:
    """Parse flags, train (or resume) and write the run directory."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", choices=[a for a in AGENTS if a != "rebrac"], required=True)
    p.add_argument("--dataset", required=True, help="D4RL-layout HDF5 file")
    p.add_argument("--env", required=True, help="Gymnasium env id for evaluation")
    p.add_argument("--steps", type=int, default=1_000_000, help="total gradient steps")
    p.add_argument("--config", default=None, help="JSON {jaxrl field: value}; default: paper's")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument(
        "--prdc-index",
        choices=("sklearn", "torch"),
        default="sklearn",
        help="PRDC's neighbour search: d3rlpy's scikit-learn index, or the same exact search in "
        "torch (d3rlpy_offline.TorchNeighbours; far faster on keys over 15 features)",
    )
    rundir.add_common_args(p, eval_every=10_000, eval_episodes=10)
    args = p.parse_args()
    if args.eval_every <= 0 or args.steps <= 0:
        p.error("--steps and --eval-every must be positive")

    run = rundir.RunDir(args.out)
    run.exit_if_finished()
    torch.set_num_threads(args.threads)
    # d3rlpy logs through structlog to stdout; stdout is kept for the summary line.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    cfg = {**PAPER_DEFAULTS[args.algo], **(json.loads(args.config) if args.config else {})}
    if "max_steps" in cfg and cfg["max_steps"] is None:  # as jaxrl: a schedule spans the run
        cfg["max_steps"] = args.steps
    d3_config, unmatched = make_config(args.algo, cfg)
    refs, refs_source = dataset_refs(args.dataset, args.env)
    settings = {
        "jaxrl": cfg,
        "d3rlpy": describe(d3_config),
        "d3rlpy_class": type(d3_config).__name__,
        "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes,
        "eval": "deterministic policy (algo.predict) in the Gymnasium env",
        "eval_seeds": f"episode i of every evaluation resets with seed {10**6}+1000*seed+i",
        "ref_returns": list(refs) if refs else None,
        "ref_returns_source": refs_source,
        "torch_threads": torch.get_num_threads(),
        "prdc_index": args.prdc_index if args.algo == "prdc" else None,
        "unmatched": unmatched,
    }
    config = {
        "agent": args.algo,
        "env": args.env,
        "dataset": os.path.abspath(args.dataset),
        "seed": args.seed,
        "impl": f"d3rlpy {d3rlpy.__version__}",
        "total_steps": args.steps,
        "settings": settings,
    }
    run.write_config(config)

    dataset = load_dataset(args.dataset)
    algo = d3_config.create(device="cpu")
    build_scalers_with_transition_picker(algo, dataset)
    algo.build_with_dataset(dataset)
    # PRDC's index (``fitter`` does not build it; ``fit`` would).
    fit_neighbours(algo, dataset, args.prdc_index)
    meta = run.checkpoint()
    step = 0
    if meta is not None:
        step = int(meta["step"])
        algo.load_model(os.path.join(meta["dir"], "model.d3"))
        algo.set_grad_step(step)
        print(f"resuming {args.out} at step {step}", file=sys.stderr, flush=True)
    # Seeded by the start step, so a resumed segment is reproducible too.
    d3rlpy.seed(args.seed + step)

    env = gym.make(args.env)
    eval_seed = 10**6 + 1000 * args.seed
    for point in rundir.eval_points(args.steps, args.eval_every):
        if point <= step:
            continue
        chunk = point - step
        for _ in algo.fitter(
            dataset,
            n_steps=chunk,
            n_steps_per_epoch=chunk,
            logger_adapter=NoopAdapterFactory(),
            show_progress=False,
        ):
            pass
        step = point
        if algo.grad_step != step:
            raise RuntimeError(f"d3rlpy counted {algo.grad_step} gradient steps, expected {step}")
        mean, std = evaluate(algo, env, args.eval_episodes, eval_seed)
        run.append_metrics(step, mean, std)
        print(f"step {step} eval_return {mean:.2f} +- {std:.2f}", file=sys.stderr, flush=True)
        run.save_checkpoint(step, lambda d: algo.save_model(os.path.join(d, "model.d3")))
    env.close()
    wall = run.wall_clock_s()
    run.finish(config, refs, updates_per_s=args.steps / max(wall, 1e-9))


if __name__ == "__main__":
    main()
