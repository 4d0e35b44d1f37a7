"""TD-MPC2 on this CPU: planning latency, update time, training speed, and learning against SAC.

Three parts, each a table in ``benchmarks/results/tdmpc2_vs_sac.md``:

(a) **Latency.** The wall time of one jitted ``plan_actions`` call (one env, ``explore=True`` as
    in training, the warm start carried from call to call, ``block_until_ready``) over
    ``--actions`` calls, and of one jitted ``update`` on a ``[batch, horizon]`` sequence batch,
    compilation excluded (reported separately), at the published defaults (``TDMPC2Config()``,
    the 5M-parameter model: latent 512, MLPs 512, 5 Qs, 512 samples x 6 iterations x horizon 3,
    batch 256) and at ``CPU_CONFIG``, for Pendulum-v1's dimensions (3 obs, 1 action) and
    HalfCheetah-v5's (17 obs, 6 actions). A config acts in real time at 50 Hz when an action
    takes at most 20 ms (p90); training in real time also needs the update in those 20 ms.
(b) **Training speed**: env-steps/s of the runs of (c) (host loop, ``summary.json``'s
    ``env_steps_per_s``, compilation and evaluations included) and of a fused-loop run on
    ``jax:pendulum`` with the learning test's settings.
(c) **Learning**: TD-MPC2 at ``CPU_CONFIG`` against jaxrl SAC at its defaults (256x256 MLPs,
    batch 256, 1 update per step) on Pendulum-v1 and InvertedPendulum-v5 (host loop), the same
    env steps each, eval curves (``--eval-episodes`` deterministic episodes every
    ``--eval-every`` steps). Both agents warm up with ``learning_starts = 1000`` random steps
    (TD-MPC2's own rule gives 1000 on Pendulum's 200-step episodes but 5000 on
    InvertedPendulum's 1000-step ones, SAC's default is 5000: too much of a 10k budget).
    TD-MPC2's discount comes from the episode length as in ``jaxrl train`` (0.975 on
    Pendulum-v1, 0.995 on InvertedPendulum-v5); SAC keeps 0.99.

``CPU_CONFIG`` is the configuration of ``tests/test_tdmpc2_learning.py``'s learning test (which
runs it in the fused loop with 2 envs and one update per 2 env steps; the host loop here takes
one update per env step, its minimum).

It is the ``tdmpc2`` section of ``benchmarks/planners.py``:

    .venv/bin/python benchmarks/planners.py --only tdmpc2 [--tdmpc2-seeds 0 1]

which writes its tables into benchmarks/results/planners.{md,json} and the eval curves into
benchmarks/results/tdmpc2_vs_sac.png. Run it on a quiet machine: the numbers are wall-clock
times, and another process on the 2 cores doubles them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import registry
from jaxrl.agents import TDMPC2, TDMPC2Config
from jaxrl.envs import can_terminate
from jaxrl.loops import TrainConfig
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train
from jaxrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
REAL_TIME_MS = 20.0  # one action per control step at 50 Hz

CPU_CONFIG = dict(model_size="cpu", lr=1e-3, batch_size=64, buffer_size=100_000)
"""The learning test's TD-MPC2 configuration (the rest at the defaults): the "cpu" model size,
64-wide with 2 Qs and MPPI at 64 samples x 3 iterations."""

LATENCY_CONFIGS = {"published defaults (5M)": {}, "CPU config": CPU_CONFIG}
DIMS = {"Pendulum-v1": (3, 1), "HalfCheetah-v5": (17, 6)}


def _median_p90(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1e3
    return float(np.median(ms)), float(np.percentile(ms, 90))


def latency_row(name: str, fields: dict, env: str, actions: int, updates: int) -> dict:
    """Planning latency per action and update time of one configuration, compilation excluded."""
    cfg = TDMPC2Config(**fields)
    obs_dim, act_dim = DIMS[env]
    agent = TDMPC2.create(cfg, jnp.zeros(obs_dim), jnp.zeros(act_dim), 0)
    n_params = sum(x.size for x in jax.tree.leaves((agent.model.params, agent.policy.params)))

    act = jax.jit(lambda a, p, o, f, k: a.plan_actions(p, o, f, k, True))
    plan, obs = agent.init_plan(1), jnp.zeros((1, obs_dim))
    first, key = jnp.zeros(1, bool), jax.random.key(0)
    t = time.perf_counter()
    act = act.lower(agent, plan, obs, first, key).compile()
    compile_act = time.perf_counter() - t
    plan_times = []
    for i in range(actions):
        obs = jax.random.normal(jax.random.key(i), (1, obs_dim))  # a new state every step
        t = time.perf_counter()
        action, plan = act(agent, plan, obs, first, jax.random.key(i))
        jax.block_until_ready(action)
        plan_times.append(time.perf_counter() - t)

    b, h = cfg.batch_size, cfg.horizon
    keys = jax.random.split(jax.random.key(1), 3)
    batch = Transition(
        obs=jax.random.normal(keys[0], (b, h, obs_dim)),
        action=jax.random.uniform(keys[1], (b, h, act_dim), minval=-1, maxval=1),
        reward=jax.random.normal(keys[2], (b, h)),
        next_obs=jax.random.normal(keys[0], (b, h, obs_dim)),
        terminal=jnp.zeros((b, h)),
    )
    update = jax.jit(lambda a, x: a.update(x)[0], donate_argnums=0)
    t = time.perf_counter()
    update = update.lower(agent, batch).compile()
    compile_update = time.perf_counter() - t
    update_times = []
    for _ in range(updates):
        t = time.perf_counter()
        agent = update(agent, batch)
        jax.block_until_ready(agent)
        update_times.append(time.perf_counter() - t)

    plan_med, plan_p90 = _median_p90(plan_times)
    upd_med, upd_p90 = _median_p90(update_times)
    row = {
        "config": name,
        "dims": env,
        "params": int(n_params),
        "sizes": {k: getattr(cfg, k) for k in ("latent_dim", "mlp_dim", "num_q", "batch_size")},
        "planner": {k: getattr(cfg, k) for k in ("num_samples", "iterations", "horizon")},
        "plan_ms_median": plan_med,
        "plan_ms_p90": plan_p90,
        "update_ms_median": upd_med,
        "update_ms_p90": upd_p90,
        "compile_plan_s": compile_act,
        "compile_update_s": compile_update,
        "actions": actions,
        "updates": updates,
        "acts_in_real_time": plan_p90 <= REAL_TIME_MS,
        "trains_in_real_time": plan_p90 + upd_p90 <= REAL_TIME_MS,
    }
    print(
        f"{name} ({env} dims, {n_params / 1e6:.2f}M params): plan {plan_med:.1f} / "
        f"{plan_p90:.1f} ms, update {upd_med:.1f} / {upd_p90:.1f} ms",
        flush=True,
    )
    return row


def _agent_config(agent: str, env: str) -> Any:
    cls = registry.get(agent).config
    if agent == "tdmpc2":  # episodic where the env can terminate (InvertedPendulum-v5)
        return cls(**{**CPU_CONFIG, "learning_starts": 1000, "episodic": can_terminate(env)})
    return cls(learning_starts=1000)


def learning_run(agent: str, env: str, seed: int, steps: int, args: Any, root: str) -> dict:
    """One ``jaxrl train`` run; its eval curve and speed."""
    out = os.path.join(root, f"{agent}-{env}-s{seed}")
    run = TrainConfig(
        env=env, total_steps=steps, seed=seed, out=out, progress=False, tensorboard=False,
        eval_every=args.tdmpc2_eval_every, eval_episodes=args.tdmpc2_eval_episodes,
        log_every=args.tdmpc2_eval_every,
    )  # fmt: skip
    t = time.perf_counter()
    summary = train(agent, run, _agent_config(agent, env))
    wall = time.perf_counter() - t
    with open(os.path.join(out, "config.json")) as f:
        resolved = json.load(f)["agent_config"]
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    curve = [[int(r["step"]), float(r["eval_return"])] for r in rows if "eval_return" in r]
    result = {
        "agent": agent,
        "env": env,
        "seed": seed,
        "steps": steps,
        "curve": curve,
        "final_eval_return": summary["final_eval_return_mean"],
        "env_steps_per_s": summary["env_steps_per_s"],
        "wall_s": wall,
        "discount": resolved["discount"],
        "learning_starts": resolved["learning_starts"],
    }
    print(
        f"{agent} {env} seed {seed}: final {result['final_eval_return']:.1f}, "
        f"{result['env_steps_per_s']:.1f} env-steps/s, {wall:.0f} s; curve {curve}",
        flush=True,
    )
    return result


def fused_speed(steps: int) -> dict:
    """The learning test's run (fused loop, ``jax:pendulum``): env-steps/s and final return."""
    with tempfile.TemporaryDirectory() as out:
        run = TrainConfig(
            env="jax:pendulum", total_steps=steps, seed=0, out=out, progress=False,
            tensorboard=False, num_envs=2, updates_per_step=1, eval_every=steps, log_every=1000,
        )  # fmt: skip
        t = time.perf_counter()
        summary = train("tdmpc2", run, TDMPC2Config(**{**CPU_CONFIG, "buffer_size": 10_000}))
        wall = time.perf_counter() - t
        rows = read_metrics(os.path.join(out, "metrics.csv"))
    steady = [r["time/env_steps_per_s"] for r in rows if r["step"] > 2000]
    result = {
        "env": "jax:pendulum",
        "steps": steps,
        "num_envs": 2,
        "updates_per_env_step": 0.5,
        "env_steps_per_s": summary["env_steps_per_s"],
        "steady_env_steps_per_s": float(np.median(steady)) if steady else None,
        "wall_s": wall,
        "final_eval_return": summary["final_eval_return_mean"],
    }
    print(f"fused jax:pendulum: {result}", flush=True)
    return result


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r["env"] for r in runs})
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    colors = {"tdmpc2": "tab:blue", "sac": "tab:orange"}
    for ax, env in zip(axes[0], envs, strict=True):
        for r in (r for r in runs if r["env"] == env):
            steps, values = zip(*r["curve"], strict=True)
            label = f"{'TD-MPC2 (CPU config)' if r['agent'] == 'tdmpc2' else 'SAC'} s{r['seed']}"
            style = "-" if r["seed"] == min(x["seed"] for x in runs) else "--"
            ax.plot(steps, values, style, color=colors[r["agent"]], marker="o", ms=3, label=label)
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def tdmpc2_section(args: Any) -> dict:
    """The ``tdmpc2`` section of ``benchmarks/planners.py``.

    Part (a), then (b) and (c) unless ``args.tdmpc2_skip_learning``; the eval curves go to
    ``results/tdmpc2_vs_sac.png``.
    """
    part: dict[str, Any] = {"cpu_config": CPU_CONFIG, "latency": [], "learning": []}
    for name, fields in LATENCY_CONFIGS.items():
        for env in DIMS:
            actions = args.tdmpc2_actions if fields else max(20, args.tdmpc2_actions // 4)
            updates = args.tdmpc2_updates if fields else max(10, args.tdmpc2_updates // 3)
            part["latency"].append(latency_row(name, fields, env, actions, updates))
    if args.tdmpc2_skip_learning:
        return part
    part["fused"] = fused_speed(args.tdmpc2_fused_steps)
    part["eval_every"], part["eval_episodes"] = args.tdmpc2_eval_every, args.tdmpc2_eval_episodes
    with tempfile.TemporaryDirectory() as root:
        for env in args.tdmpc2_envs:
            for seed in args.tdmpc2_seeds:
                for agent in ("tdmpc2", "sac"):
                    run = learning_run(agent, env, seed, args.tdmpc2_steps, args, root)
                    part["learning"].append(run)
    plot(part["learning"], os.path.join(RESULTS, "tdmpc2_vs_sac.png"))
    return part


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The section's options (``--tdmpc2-*``) on ``benchmarks/planners.py``'s parser."""
    add = parser.add_argument
    add("--tdmpc2-seeds", type=int, nargs="+", default=[0, 1], help="tdmpc2: learning seeds")
    add("--tdmpc2-steps", type=int, default=10_000, help="tdmpc2: env steps per learning run")
    add("--tdmpc2-envs", nargs="+", default=["Pendulum-v1", "InvertedPendulum-v5"])
    add("--tdmpc2-eval-every", type=int, default=1000)
    add("--tdmpc2-eval-episodes", type=int, default=5)
    add("--tdmpc2-actions", type=int, default=100, help="tdmpc2: timed planning calls")
    add("--tdmpc2-updates", type=int, default=30, help="tdmpc2: timed updates")
    add("--tdmpc2-fused-steps", type=int, default=4000)
    add("--tdmpc2-skip-learning", action="store_true", help="tdmpc2: latency rows only")


def tdmpc2_table(part: dict) -> list[str]:
    """Markdown lines of the ``tdmpc2`` section."""
    lines = [
        "## TD-MPC2: latency, training speed, learning against SAC",
        "",
        "`CPU config`: " + ", ".join(f"{k}={v}" for k, v in part["cpu_config"].items())
        + " (the rest at TD-MPC2's defaults; the configuration of the learning test).",
        "",
        "### Planning latency per action and update time (ms; median / p90)",
        "",
        f"One env, compilation excluded; {REAL_TIME_MS:.0f} ms per action is real time at 50 Hz. "
        "The update is one gradient step on a batch of `horizon`-step sequences.",
        "",
        "| config | dims | params | plan median | plan p90 | update median | update p90 "
        "| compile plan + update (s) | acts at 50 Hz | acts + trains at 50 Hz |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in part["latency"]:
        lines.append(
            f"| {r['config']} | {r['dims']} | {r['params'] / 1e6:.2f}M | "
            f"{r['plan_ms_median']:.1f} | {r['plan_ms_p90']:.1f} | {r['update_ms_median']:.1f} | "
            f"{r['update_ms_p90']:.1f} | {r['compile_plan_s']:.0f} + {r['compile_update_s']:.0f} | "
            f"{'yes' if r['acts_in_real_time'] else 'no'} | "
            f"{'yes' if r['trains_in_real_time'] else 'no'} |"
        )
    runs = part.get("learning", [])
    if runs or part.get("fused"):
        lines += [
            "",
            "### Training speed (env-steps/s, whole run: compilation and evaluations included)",
            "",
            "| agent | env | loop | updates per env step | env-steps/s | wall (s) |",
            "|---|---|---|---|---|---|",
        ]
        for r in runs:
            lines.append(
                f"| {r['agent']} | {r['env']} | host | 1 | {r['env_steps_per_s']:.1f} | "
                f"{r['wall_s']:.0f} |"
            )
        if f := part.get("fused"):
            steady = f["steady_env_steps_per_s"]
            after = "" if steady is None else f" (after step 2000: {steady:.1f})"
            lines.append(
                f"| tdmpc2 | jax:pendulum (2 envs) | fused | 0.5 | "
                f"{f['env_steps_per_s']:.1f}{after} | {f['wall_s']:.0f} |"
            )
    if runs:
        lines += [
            "",
            "### Learning: final eval return and eval curve, equal env steps",
            "",
            "TD-MPC2: CPU config, learning_starts 1000, discount from the episode length. SAC: "
            "jaxrl defaults (256x256, batch 256, utd 1), learning_starts 1000. Host loop, "
            f"{part['eval_episodes']} deterministic eval episodes every {part['eval_every']} "
            "steps (TD-MPC2 evaluates by planning).",
            "",
            "| env | agent | seed | discount | final return | curve (step: return) |",
            "|---|---|---|---|---|---|",
        ]
        for r in runs:
            curve = ", ".join(f"{s // 1000}k: {v:.0f}" for s, v in r["curve"])
            lines.append(
                f"| {r['env']} | {r['agent']} | {r['seed']} | {r['discount']:.3f} | "
                f"{r['final_eval_return']:.1f} | {curve} |"
            )
        lines += ["", "![TD-MPC2 and SAC eval curves](tdmpc2_vs_sac.png)"]
    return lines
