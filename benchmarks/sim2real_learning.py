"""Does training with domain randomization keep more return outside the training ranges?

Two policies are trained with the project's own loop (``jaxrl.run.train``, ``--num-seeds``
vmapped seeds in one program, one run directory per seed) on a small Brax MJX task:

* **plain**: the nominal env;
* **randomized**: the same env with its physics drawn at every reset in the stated training
  ranges (env-id options, ``jaxrl.envs.randomization.Ranges``; every other field off).

Every seed's final policy (its newest checkpoint, restored with ``jaxrl.run.runs.load_run``) is
then evaluated with its deterministic policy on the same evaluation keys in the nominal env and
in a perturbed env whose fixed parameters lie outside the training ranges. Reported per seed:
nominal return, perturbed return and the fraction kept (perturbed / nominal); means and
standard deviations per mode. Nothing is tuned on the result: the ranges, the perturbation and
the budget are flags, and the script records them.

Usage:
    .venv/bin/python benchmarks/sim2real_learning.py [--agent ppo] [--total-steps N]
        [--seeds 3] [--episodes 32] [--train-ranges mass_scale=0.7:1.3,...]
        [--perturbation mass_scale=2,...] [--runs DIR] [--reuse] [--out DIR]

Writes benchmarks/results/sim2real_learning.{md,json} (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from typing import Any

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def env_id(task: str, ranges: dict[str, str]) -> str:
    """``brax:TASK`` with exactly ``ranges`` randomized: every other ``Ranges`` field is off.

    Args:
        task: a Brax env name.
        ranges: ``Ranges`` field -> ``LOW:HIGH`` or ``K`` (empty: the plain env).
    """
    from jaxrl.envs.randomization import field_names

    if not ranges:
        return f"brax:{task}"
    unknown = sorted(set(ranges) - set(field_names()))
    if unknown:
        raise ValueError(f"Unknown Ranges fields {unknown}; known: {', '.join(field_names())}.")
    options = [f"{k}={ranges[k] if k in ranges else 'none'}" for k in field_names()]
    return f"brax:{task}?" + "&".join(options)


def parse_ranges(text: str) -> dict[str, str]:
    """``'mass_scale=0.7:1.3,motor_strength=0.7:1.3'`` as a dict (validated by the env id)."""
    out = {}
    for part in filter(None, text.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"{part!r} is not FIELD=LOW:HIGH or FIELD=K.")
        out[key.strip()] = value.strip()
    return out


def train_mode(agent: str, train_env: str, out: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.seeds`` seeds of ``agent`` on ``train_env`` into ``out/s<seed>``."""
    from jaxrl import registry
    from jaxrl.loops.config import TrainConfig
    from jaxrl.run import train

    cfg = TrainConfig(
        env=train_env,
        total_steps=args.total_steps,
        seed=0,
        num_envs=args.num_envs,
        num_seeds=args.seeds,
        out=out,
        eval_every=args.eval_every,
        eval_episodes=8,
        progress=False,
        tensorboard=False,
    )
    t0 = time.perf_counter()
    summary = train(agent, cfg, registry.get(agent).config())
    summary["benchmark_wall_clock_s"] = time.perf_counter() - t0
    return summary


def seed_dirs(out: str, seeds: int) -> list[str]:
    """The per-seed run directories ``jaxrl.run.train`` writes with ``num_seeds`` (s0, s1, ...)."""
    return [os.path.join(out, f"s{i}") for i in range(seeds)] if seeds > 1 else [out]


class Evaluator:
    """Deterministic-policy returns of restored runs in any JAX env id (one compile per id)."""

    def __init__(self, episodes: int, seed: int):
        self.episodes, self.seed, self._fns = episodes, seed, {}

    def __call__(self, run: Any, spec: Any, eval_env_id: str) -> np.ndarray:
        """Returns of ``run``'s agent (a ``LoadedRun``) over ``episodes`` episodes of the env.

        The env is built as the run's own evaluation env is (``make_jax_envs``: frozen
        observation normalization with the run's training statistics when the agent uses it),
        but from ``eval_env_id``. Every run gets the same evaluation key.
        """
        from jaxrl.loops.acting import acting
        from jaxrl.loops.evaluation import evaluate_jax
        from jaxrl.run.runs import make_jax_envs

        if eval_env_id not in self._fns:
            _, env = make_jax_envs(eval_env_id, 1, self.episodes, run.agent_config, spec)
            policy = acting(spec)
            self._fns[eval_env_id] = jax.jit(
                lambda a, s, k: evaluate_jax(a, env, k, s, policy=policy)
            )
        key = jax.random.key(self.seed)
        return np.asarray(self._fns[eval_env_id](run.agent, run.obs_stats, key))


def evaluate_mode(out: str, envs: dict[str, str], ev: Evaluator, seeds: int) -> list[dict]:
    """Per seed of ``out``: mean return in each of ``envs`` (name -> id) and fraction kept."""
    from jaxrl import registry
    from jaxrl.run.runs import load_run

    rows = []
    for d in seed_dirs(out, seeds):
        run = load_run(d)
        spec = registry.get(run.config["agent"])
        row: dict[str, Any] = {"run": d, "seed": run.config["seed"], "step": run.meta["step"]}
        for name, eid in envs.items():
            returns = ev(run, spec, eid)
            row[name] = float(returns.mean())
            row[f"{name}_std"] = float(returns.std())
        row["kept"] = row["perturbed"] / row["nominal"] if row["nominal"] else float("nan")
        rows.append(row)
        print(json.dumps(row))
    return rows


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def write_results(result: dict[str, Any], out_dir: str) -> None:
    """``sim2real_learning.json`` (everything) and ``.md`` (the tables)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "sim2real_learning.json"), "w") as f:
        json.dump(result, f, indent=2)
    a, envs = result["args"], result["envs"]
    lines = [
        "# Sim-to-real: return kept outside the training ranges, with and without randomization",
        "",
        f"Machine: {result['meta']['machine']}, jax {result['meta']['jax']}. "
        f"{a['agent'].upper()} (default config) on `brax:{a['task']}` (MJX), {a['num_envs']} envs, "
        f"{a['total_steps']:,} env steps per seed, seeds 0-{a['seeds'] - 1} vmapped in one "
        f"program per mode (`jaxrl.run.train`, `num_seeds={a['seeds']}`). Each seed's final "
        f"policy (deterministic) is evaluated on {a['episodes']} episodes (the same evaluation "
        "key for every run) in the nominal env and in the perturbed env. 'kept' = perturbed / "
        "nominal return.",
        "",
        "Env ids:",
        "",
        f"- train, plain: `{envs['train_plain']}`",
        f"- train, randomized: `{envs['train_randomized']}`",
        f"- eval, nominal: `{envs['nominal']}`",
        f"- eval, perturbed: `{envs['perturbed']}`",
        "",
        "| mode | seed | nominal return | perturbed return | kept |",
        "|---|---|---|---|---|",
    ]
    for mode in ("plain", "randomized"):
        for r in result["modes"][mode]["seeds"]:
            lines.append(
                f"| {mode} | {r['seed']} | {r['nominal']:.1f} | {r['perturbed']:.1f} | "
                f"{r['kept']:.3f} |"
            )
    lines += ["", "| mode | nominal (mean ± std) | perturbed (mean ± std) | kept (mean ± std) |"]
    lines.append("|---|---|---|---|")
    for mode in ("plain", "randomized"):
        m = result["modes"][mode]
        lines.append(
            f"| {mode} | {m['nominal']['mean']:.1f} ± {m['nominal']['std']:.1f} | "
            f"{m['perturbed']['mean']:.1f} ± {m['perturbed']['std']:.1f} | "
            f"{m['kept']['mean']:.3f} ± {m['kept']['std']:.3f} |"
        )
    lines += [
        "",
        f"**Result:** {result['verdict']}",
        "",
        f"Wall-clock: {result['wall_clock_s']:.0f} s"
        + (" (evaluation only, `--reuse`; training " if a["reuse"] else " (training ")
        + ", ".join(f"{k} {v:.0f} s" for k, v in result["train_wall_clock_s"].items())
        + f"); std is over seeds (population std, n = {a['seeds']}).",
    ]
    if result.get("notes"):
        lines += ["", result["notes"]]
    lines += ["", f"Regenerate: `{result['command']}`"]
    with open(os.path.join(out_dir, "sim2real_learning.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def verdict(modes: dict[str, Any]) -> str:
    """A few sentences comparing the modes' fraction kept, decided by the numbers."""
    p, r = modes["plain"]["kept"], modes["randomized"]["kept"]
    kept = {m: [s["kept"] for s in modes[m]["seeds"]] for m in modes}
    survived = {m: sum(k >= 0.9 for k in kept[m]) for m in kept}
    n = len(kept["plain"])
    more = "keep more" if r["mean"] > p["mean"] else "do NOT keep more"
    text = (
        f"the randomized policies {more} of their return in the perturbed env "
        f"({r['mean']:.3f} against {p['mean']:.3f} for the plain ones, mean over seeds); "
        f"{survived['randomized']} of {n} randomized seeds and {survived['plain']} of {n} plain "
        "seeds keep at least 90%."
    )
    diff, spread = abs(r["mean"] - p["mean"]), max(r["std"], p["std"])
    if diff < spread:
        text += (
            f" The difference ({diff:.3f}) is smaller than the spread over seeds (std up to "
            f"{spread:.3f}): with {n} seeds this is weak evidence, not a measured effect size."
        )
    return text


def main() -> None:
    """Train both modes, evaluate every seed in the nominal and the perturbed env, write."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default="ppo", help="a registered online agent (ppo, sac, td3)")
    p.add_argument("--task", default="inverted_pendulum", help="a Brax env name (MJX)")
    p.add_argument("--total-steps", type=int, default=163_840, help="env steps per seed")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--eval-every", type=int, default=40_960, help="training-curve evaluations")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--episodes", type=int, default=32, help="evaluation episodes per env")
    p.add_argument(
        "--train-ranges",
        default="mass_scale=0.5:1.5,motor_strength=0.5:1.5",
        help="randomized mode: Ranges fields as FIELD=LOW:HIGH, comma-separated (others off)",
    )
    p.add_argument(
        "--perturbation",
        default="motor_strength=0.1",
        help="the perturbed evaluation env: FIELD=K or FIELD=LOW:HIGH, comma-separated",
    )
    p.add_argument("--runs", default=os.path.join(ROOT, "runs", "sim2real_learning"))
    p.add_argument("--reuse", action="store_true", help="evaluate existing runs, do not train")
    p.add_argument("--notes", default="", help="text appended to the markdown (what was tried)")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args()
    t0 = time.perf_counter()
    envs = {
        "train_plain": env_id(a.task, {}),
        "train_randomized": env_id(a.task, parse_ranges(a.train_ranges)),
        "nominal": env_id(a.task, {}),
        "perturbed": env_id(a.task, parse_ranges(a.perturbation)),
    }
    train_walls, modes = {}, {}
    ev = Evaluator(a.episodes, seed=123_457)
    eval_envs = {"nominal": envs["nominal"], "perturbed": envs["perturbed"]}
    for mode in ("plain", "randomized"):
        out = os.path.join(a.runs, mode)
        if not a.reuse:
            shutil.rmtree(out, ignore_errors=True)
            summary = train_mode(a.agent, envs[f"train_{mode}"], out, a)
            train_walls[mode] = summary["benchmark_wall_clock_s"]
        else:  # the training loop's own wall-clock, from the runs' summary
            with open(os.path.join(out, "summary.json")) as f:
                train_walls[mode] = json.load(f)["wall_clock_s"]
        rows = evaluate_mode(out, eval_envs, ev, a.seeds)
        modes[mode] = {
            "seeds": rows,
            **{k: _stats([r[k] for r in rows]) for k in ("nominal", "perturbed", "kept")},
        }
    result = {
        "meta": {
            "machine": f"{os.cpu_count()} CPUs, {platform.machine()}",
            "jax": jax.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "args": vars(a),
        "envs": envs,
        "modes": modes,
        "verdict": verdict(modes),
        "train_wall_clock_s": train_walls,
        "wall_clock_s": time.perf_counter() - t0,
        "command": "python benchmarks/sim2real_learning.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(a).items()
            if k in ("agent", "task", "total_steps", "seeds", "episodes")
        )
        + f" --train-ranges {a.train_ranges} --perturbation {a.perturbation}",
        "notes": a.notes,
    }
    write_results(result, a.out)
    print(result["verdict"])


if __name__ == "__main__":
    main()
