"""Planning latency per action of the MPPI / CEM planners and of the planning agents.

Sections (``--only NAME ...`` runs some of them; the others keep their stored results):

``true-model``: ``jaxrl plan`` (``jaxrl.loops.plan.plan_run``) on ``jax:pendulum``, the
model being copies of the simulator state, at

  - TD-MPC2's published planner defaults: 512 samples, 64 elites, 6 iterations, horizon 3
    (without TD-MPC2's terminal Q value a 3-step horizon cannot see a swing-up: expect a poor
    return; the row measures the planner's cost at those sizes), and
  - a small CPU configuration that swings the pendulum up (horizon 20, 64 samples, 8 elites,
    4 iterations; the setting of ``tests/test_planners.py``), with MPPI and CEM.

  Latency is the wall time of one jitted planning call (one env, ``block_until_ready``), over
  every action of ``--episodes`` 200-step episodes, compilation excluded (compiled ahead of
  time; its time is reported separately). Episodes start from Pendulum's random initial states
  (seeded), so returns range from about -1 (starting upright) to about -350 (hanging down).

``pets``: PETS (``jaxrl.agents.pets``) with its learned ensemble as the model, on
``jax:pendulum``:

  - latency per action of ``PETS.plan_actions`` (one env, the jitted call the loops make,
    compiled ahead of time) at the published defaults (``PETSConfig()``, mbrl-lib's: 7 members
    of 4x200, CEM population 500 x 5 iterations over 15 steps, 20 particles; ~180 GFLOP per
    action, so only ``--pets-default-actions`` actions) and at the CPU configuration of
    ``tests/test_pets.py``'s learning test (``PETS_CPU``, over one 200-step episode). The
    agent is untrained (the cost does not depend on the weights); the env follows its actions;
  - env-steps/s of ``jaxrl train pets`` at ``PETS_CPU``, fused loop on ``jax:pendulum`` and
    host loop on Gymnasium's ``Pendulum-v1`` (1 env each): ``learning_starts`` random steps,
    then planning steps with a refit of the ensemble every ``model_train_freq`` steps; the
    rate is timed over the planning steps after the first log interval (which holds the
    compilation), from the
    ``time/env_steps_per_s`` of ``metrics.csv`` (the final evaluation is not timed).

``tdmpc2``: TD-MPC2's planning latency and update time at the published defaults and at the
learning test's CPU configuration, its training speed, and its learning against SAC on
Pendulum-v1 and InvertedPendulum-v5 at equal env steps (``benchmarks/tdmpc2_vs_sac.py``).

    .venv/bin/python benchmarks/planners.py [--only true-model pets tdmpc2] [--episodes 3]

Writes benchmarks/results/planners.{md,json}; the JSON merges into an existing file, so a
section run alone replaces only its own results (each section records its machine load). Add a
section by writing ``measure_X(args) -> dict`` and ``table_X(part) -> lines`` and listing them
in ``SECTIONS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from tdmpc2_vs_sac import add_arguments, tdmpc2_section, tdmpc2_table

from jaxrl.agents.pets import PETS, PETSConfig
from jaxrl.envs.jax_envs import make_jax_env
from jaxrl.loops import TrainConfig
from jaxrl.loops.logging import read_metrics
from jaxrl.loops.plan import PlanRunConfig, latency_stats, plan_run
from jaxrl.planners import PlannerConfig
from jaxrl.run import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

TRUE_SIM_CONFIGS: dict[str, PlannerConfig] = {
    "TD-MPC2 defaults (MPPI)": PlannerConfig(),
    "small CPU (MPPI)": PlannerConfig(horizon=20, num_samples=64, num_elites=8, iterations=4),
    "small CPU (CEM)": PlannerConfig(
        method="cem", horizon=20, num_samples=64, num_elites=8, iterations=4
    ),
}


def true_sim_rows(
    configs: dict[str, PlannerConfig], env: str = "jax:pendulum", episodes: int = 3, seed: int = 0
) -> list[dict]:
    """One result row per planner configuration: latency per action, compile time, returns."""
    rows = []
    for name, cfg in configs.items():
        with tempfile.TemporaryDirectory() as out:
            run = PlanRunConfig(
                env=env, episodes=episodes, seed=seed, out=out, progress=False, tensorboard=False
            )
            s = plan_run(run, cfg)
        rows.append(
            {
                "config": name,
                "env": env,
                "planner": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
                "sim_steps_per_action": cfg.num_samples * cfg.iterations * cfg.horizon,
                "latency_ms_median": s["plan_latency_ms_median"],
                "latency_ms_p90": s["plan_latency_ms_p90"],
                "latency_ms_mean": s["plan_latency_ms_mean"],
                "compile_s": s["compile_s"],
                "actions": s["total_steps"],
                "episode_returns": s["episode_returns"],
                "return_mean": s["final_eval_return_mean"],
            }
        )
        print(
            f"{name}: median {s['plan_latency_ms_median']:.2f} ms, p90 "
            f"{s['plan_latency_ms_p90']:.2f} ms, returns "
            f"{[round(r, 1) for r in s['episode_returns']]}",
            flush=True,
        )
    return rows


def true_model_section(args: argparse.Namespace) -> dict:
    """The ``true-model`` section's results."""
    return {
        "env": args.env,
        "episodes": args.episodes,
        "seed": args.seed,
        "rows": true_sim_rows(TRUE_SIM_CONFIGS, args.env, args.episodes, args.seed),
    }


def true_model_table(part: dict) -> list[str]:
    """Markdown lines of the ``true-model`` section."""
    lines = [
        "## True simulator as the model (`jaxrl plan`)",
        "",
        f"{part['env']}, {part['episodes']} episodes of 200 steps (seed {part['seed']}), one "
        "env; latency = one jitted planning call, compilation excluded.",
        "",
        "| config | method | H | samples | elites | iters | sim steps/action "
        "| median ms | p90 ms | compile s | returns |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in part["rows"]:
        p = r["planner"]
        returns = ", ".join(f"{x:.0f}" for x in r["episode_returns"])
        lines.append(
            f"| {r['config']} | {p['method']} | {p['horizon']} | {p['num_samples']} "
            f"| {p['num_elites']} | {p['iterations']} | {r['sim_steps_per_action']:,} "
            f"| {r['latency_ms_median']:.2f} | {r['latency_ms_p90']:.2f} "
            f"| {r['compile_s']:.1f} | {returns} |"
        )
    return lines


# ------------------------------------------------------------------------------------- PETS

PETS_CPU = dict(
    reward_fn="pendulum",
    ensemble_size=4,
    num_elites=2,
    hidden_dims=(64, 64),
    num_particles=4,
    horizon=15,
    population=64,
    cem_elites=8,
    cem_iterations=3,
    learning_starts=200,
    buffer_size=600,
    model_train_freq=25,
    model_epochs=25,
    patience=25,
    batch_size=64,
    model_lr=7.5e-4,
    validation_ratio=0.1,
)
"""The CPU-sized PETS of ``tests/test_pets.py``'s learning test (its ``PETS_CPU`` flags)."""

PETS_LATENCY_CONFIGS: dict[str, PETSConfig] = {
    "PETS defaults (mbrl-lib)": PETSConfig(),
    "PETS CPU (learning test)": PETSConfig(**PETS_CPU),
}


def _pets_sizes(cfg: PETSConfig) -> dict:
    keys = ("reward_fn", "ensemble_size", "num_elites", "hidden_dims", "num_particles")
    keys += ("horizon", "population", "cem_elites", "cem_iterations")
    return {k: getattr(cfg, k) for k in keys}


def pets_latency_row(name: str, cfg: PETSConfig, env_id: str, actions: int, seed: int) -> dict:
    """Latency of ``PETS.plan_actions`` (one env, jitted as the loops call it) over ``actions``."""
    env = make_jax_env(env_id, 1)
    obs = jnp.zeros(env.observation_size, jnp.float32)
    agent = PETS.create(cfg, obs, jnp.zeros(env.action_size, jnp.float32), seed)
    plan_fn = jax.jit(lambda a, p, o, f, k: a.plan_actions(p, o, f, k, explore=False))
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    key = jax.random.key(seed)
    state, plan = reset(jax.random.key(seed + 1)), agent.init_plan(1)
    t0 = time.perf_counter()
    plan_fn = plan_fn.lower(agent, plan, state.obs, state.time == 0, key).compile()
    compile_s = time.perf_counter() - t0
    latencies = []
    for _ in range(actions):
        key, k = jax.random.split(key)
        tic = time.perf_counter()
        action, plan = plan_fn(agent, plan, state.obs, state.time == 0, k)
        action.block_until_ready()
        latencies.append(time.perf_counter() - tic)
        state = step(state, action)
    lat = latency_stats(latencies)
    rows_per_action = cfg.population * cfg.cem_iterations * cfg.horizon * cfg.num_particles
    # Matmul FLOPs of one member's forward pass (XLA's cost analysis counts a loop body once).
    dims = (env.observation_size + env.action_size, *cfg.hidden_dims)
    out = 2 * (env.observation_size + (cfg.reward_fn == "learned"))
    flop_per_row = 2 * sum(a * b for a, b in zip(dims, (*dims[1:], out), strict=True))
    gflop = rows_per_action * flop_per_row / 1e9
    row = {
        "config": name,
        "env": env_id,
        "pets": _pets_sizes(cfg),
        "model_rows_per_action": rows_per_action,
        "gflop_per_action": gflop,
        "gflop_per_s": gflop / (lat["median"] / 1e3),
        "latency_ms_median": lat["median"],
        "latency_ms_p90": lat["p90"],
        "latency_ms_mean": lat["mean"],
        "compile_s": compile_s,
        "actions": actions,
    }
    print(
        f"{name}: median {lat['median']:.1f} ms, p90 {lat['p90']:.1f} ms over {actions} actions "
        f"(compile {compile_s:.1f} s)",
        flush=True,
    )
    return row


def pets_train_row(env_id: str, steps: int, seed: int, log_every: int = 100) -> dict:
    """Env-steps/s of ``jaxrl train pets`` at ``PETS_CPU`` (1 env) over the timed window.

    The window is the planning steps after ``learning_starts`` and after the first log interval
    past it (the compilation of the planning step and the updates falls in that interval).
    """
    cfg = PETSConfig(**PETS_CPU)
    with tempfile.TemporaryDirectory() as out:
        run = TrainConfig(
            env=env_id,
            total_steps=steps,
            seed=seed,
            num_envs=1,
            out=out,
            eval_every=steps,
            eval_episodes=1,
            log_every=log_every,
            checkpoint_every=steps,
            progress=False,
            tensorboard=False,
        )
        t0 = time.perf_counter()
        summary = train("pets", run, cfg)
        wall = time.perf_counter() - t0
        rows = read_metrics(os.path.join(out, "metrics.csv"))
    start = cfg.learning_starts + log_every
    timed = [(r["step"], r["time/env_steps_per_s"]) for r in rows if r["step"] > start]
    prev = [start] + [s for s, _ in timed[:-1]]
    n_steps = sum(s - p for (s, _), p in zip(timed, prev, strict=True))
    seconds = sum((s - p) / rate for (s, rate), p in zip(timed, prev, strict=True))
    loop = "fused" if ":" in env_id else "host"
    row = {
        "env": env_id,
        "loop": loop,
        "num_envs": 1,
        "total_steps": steps,
        "learning_starts": cfg.learning_starts,
        "model_train_freq": cfg.model_train_freq,
        "timed_steps": int(n_steps),
        "env_steps_per_s": n_steps / seconds,
        "run_wall_s": wall,
        "final_eval_return": summary["final_eval_return_mean"],
    }
    print(
        f"train pets {env_id} ({loop} loop): {row['env_steps_per_s']:.1f} env-steps/s over "
        f"{n_steps} planning steps; whole run {wall:.1f} s",
        flush=True,
    )
    return row


def pets_section(args: argparse.Namespace) -> dict:
    """The ``pets`` section's results."""
    actions = {"PETS defaults (mbrl-lib)": args.pets_default_actions}
    latency = [
        pets_latency_row(name, cfg, args.env, actions.get(name, 200), args.seed)
        for name, cfg in PETS_LATENCY_CONFIGS.items()
    ]
    training = [
        pets_train_row(env_id, args.pets_train_steps, args.seed)
        for env_id in ("jax:pendulum", "Pendulum-v1")
    ]
    return {"env": args.env, "seed": args.seed, "latency": latency, "training": training}


def _refits(row: dict) -> str:
    # Results stored before the refits (PETS then took utd_ratio minibatch steps per env step).
    if "model_train_freq" in row:
        return f"a refit of the ensemble every {row['model_train_freq']} steps"
    return f"{row['utd_ratio']} model updates per step"


def pets_table(part: dict) -> list[str]:
    """Markdown lines of the ``pets`` section."""
    lines = [
        "## PETS: learned ensemble as the model (`jaxrl train pets`)",
        "",
        f"Latency per action: `PETS.plan_actions` on {part['env']}, one env, untrained "
        "ensemble (same cost as a trained one), compilation excluded. Model rows = population "
        "x CEM iterations x horizon x particles, each through one elite member; GFLOP/action "
        "counts their matmuls; GFLOP/s = GFLOP/action over the median latency.",
        "",
        "| config | reward | members (elites) | hidden | particles | H | population "
        "| CEM elites | iters | model rows/action | GFLOP/action | actions | median ms "
        "| p90 ms | GFLOP/s | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in part["latency"]:
        p = r["pets"]
        hidden = "x".join(str(h) for h in p["hidden_dims"])
        gflop = r["gflop_per_action"]
        lines.append(
            f"| {r['config']} | {p['reward_fn']} | {p['ensemble_size']} ({p['num_elites']}) "
            f"| {hidden} | {p['num_particles']} | {p['horizon']} | {p['population']} "
            f"| {p['cem_elites']} | {p['cem_iterations']} | {r['model_rows_per_action']:,} "
            f"| {gflop:.3g} | {r['actions']} | {r['latency_ms_median']:.1f} "
            f"| {r['latency_ms_p90']:.1f} | {r['gflop_per_s']:.0f} | {r['compile_s']:.1f} |"
        )
    t = part["training"][0]
    lines += [
        "",
        f"Training at the CPU config (1 env, {t['learning_starts']} random steps, then planning "
        f"with {_refits(t)}; {t['total_steps']} steps; timed over the "
        "planning steps after the first log interval, compilation and evaluation excluded):",
        "",
        "| env | loop | timed steps | env-steps/s | whole run s | eval return (1 episode) |",
        "|---|---|---|---|---|---|",
    ]
    for r in part["training"]:
        lines.append(
            f"| {r['env']} | {r['loop']} | {r['timed_steps']} | {r['env_steps_per_s']:.1f} "
            f"| {r['run_wall_s']:.1f} | {r['final_eval_return']:.1f} |"
        )
    return lines


# ------------------------------------------------------------------------------------ driver


@dataclasses.dataclass(frozen=True)
class Section:
    """One part of the results: its JSON key, how it is measured and how it is tabulated."""

    key: str
    measure: Callable[[argparse.Namespace], dict]
    table: Callable[[dict], list[str]]


SECTIONS: dict[str, Section] = {
    "true-model": Section("true_simulator", true_model_section, true_model_table),
    "pets": Section("pets", pets_section, pets_table),
    "tdmpc2": Section("tdmpc2", tdmpc2_section, tdmpc2_table),
}


def machine() -> dict:
    """This machine and its current load."""
    return {
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "load_avg_1min": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _machine_line(meta: dict) -> str:
    return (
        f"Machine: {meta['arch']}, {meta['cores']} CPU cores, no GPU; jax {meta['jax']}; 1-min "
        f"load average {meta['load_avg_1min']:.1f} at the start, "
        f"{meta.get('load_avg_1min_end', float('nan')):.1f} at the end ("
        "the cores are shared, so times include other processes' load)."
    )


def write_tables(results: dict) -> None:
    """Write results/planners.{json,md}."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "planners.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = ["# Planners: latency per action and training throughput", ""]
    for section in SECTIONS.values():
        if section.key in results:
            part = results[section.key]
            lines += [*section.table(part), "", _machine_line(part["machine"]), ""]
    text = "\n".join(lines)
    with open(os.path.join(RESULTS, "planners.md"), "w") as f:
        f.write(text)
    print(text)


def load_results() -> dict:
    """The stored results, each section holding its own machine record."""
    path = os.path.join(RESULTS, "planners.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        results = json.load(f)
    # Files written before sections were selectable have one machine record for everything.
    shared = results.pop("machine", None)
    for section in SECTIONS.values():
        if section.key in results and shared is not None:
            results[section.key].setdefault("machine", shared)
    return results


def main() -> None:
    """Measure the selected sections and merge them into the stored results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--env", default="jax:pendulum", help="JAX env of the latency rows")
    p.add_argument("--episodes", type=int, default=3, help="true-model: episodes per config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pets-default-actions", type=int, default=5, help="pets: actions timed at the defaults"
    )
    p.add_argument("--pets-train-steps", type=int, default=600, help="pets: steps per run")
    add_arguments(p)
    args = p.parse_args()
    results = load_results()
    for name in args.only:
        section = SECTIONS[name]
        meta = machine()
        part = section.measure(args)
        meta["load_avg_1min_end"] = os.getloadavg()[0]
        results[section.key] = {**part, "machine": meta}
    write_tables(results)


if __name__ == "__main__":
    main()
