"""Planning with the true simulator: MPPI / CEM on a JAX env, no learning (``jaxrl plan``).

The model is the environment itself: every candidate action sequence is rolled out from a copy
of the current simulator state (``core.step``, vmapped over the population) and scored by the
sum of its rewards. This is the upper bound a learned world model can reach with the same planner
settings, and a check of the planner on its own. Each env step plans (one jitted call), acts
with the first action of the chosen sequence and carries the plan's mean to the next step
(warm start). Episodes run one after another on one env copy, so the time of each planning
call is the latency a controller would see per action.

The run directory follows the contract of the training loops (DESIGN.md): ``config.json``;
``metrics.csv`` with one row per episode (``step`` = env steps so far, ``eval_return`` = that
episode's return, its length and planning latency); ``summary.json`` with the training loops'
keys (``final_eval_return_mean`` over the episodes) plus ``episode_returns`` and the planning
latency per action (``plan_latency_ms_median``, ``plan_latency_ms_p90``, ...); TensorBoard
events and ``learning_curve.png`` (return per episode). There are no checkpoints: a rerun with
the same ``--out`` starts over.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import check_positive, check_range, config_to_dict
from jaxrl.loops.logging import RunLogger, write_json
from jaxrl.planners import PlannerConfig, PlanState, ValueFn, init_plan, plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanRunConfig:
    """Options of a true-simulator planning run (the planner's own fields: PlannerConfig)."""

    env: str
    """JAX environment id: 'jax:pendulum', 'brax:inverted_pendulum?backend=positional', ..."""
    episodes: int = 1
    """Episodes to plan through, one after another."""
    seed: int = 0
    """Seed of the environment resets and the planner's sampling."""
    out: str | None = None
    """Run directory (default runs/plan-<method>-<env>-s<seed>); overwritten on a rerun."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard event files."""

    def __post_init__(self) -> None:
        check_positive(self, "episodes")
        check_range(self, "seed", 0, 2**31 - 1)


# ------------------------------------------------------------------------------ the model


def true_sim_value_fn(env: Any, sim: Any, time_step: jax.Array) -> ValueFn:
    """``value_fn`` scoring action sequences by rolling out copies of one env's simulator.

    The value of a sequence is the undiscounted sum of the rewards of its steps from ``sim``.
    Steps after a termination, or beyond the episode's time limit (``env.episode_length``, with
    ``time_step`` steps already taken), do not count.

    Args:
        env: a ``make_jax_env`` env (``core``, action bounds ``low``/``high`` of its
            ``RescaleAction`` and ``episode_length`` are read through the wrappers).
        sim: one env's simulator state (``EnvState.sim`` without the env axis).
        time_step: steps taken in the current episode (``EnvState.time`` of that env).

    Returns:
        ``value_fn(actions [N, H, A] in [-1, 1], key) -> [N]``.
    """
    core, limit = env.core, env.episode_length
    low, high = jnp.asarray(env.low), jnp.asarray(env.high)

    def rollout(actions: jax.Array) -> jax.Array:
        def step(carry: tuple[Any, jax.Array, jax.Array], action: jax.Array) -> tuple[Any, Any]:
            state, alive, t = carry
            # RescaleAction's map from [-1, 1] to the core's native bounds
            native = low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
            state, _, reward, terminated = core.step(state, native)
            reward = jnp.where(alive, reward, 0.0)  # also drops NaNs of a terminated Brax state
            alive = alive & (terminated == 0) & (t + 1 < limit)
            return (state, alive, t + 1), reward

        alive = jnp.asarray(time_step < limit)
        _, rewards = jax.lax.scan(step, (sim, alive, time_step), actions)
        return jnp.sum(rewards)

    return lambda actions, key: jax.vmap(rollout)(actions)


def make_plan_step(env: Any, config: PlannerConfig) -> Any:
    """The jitted planning call of every env: ``(env_state, plan, first, key) -> ...``.

    Returns a function of the env state (``[num_envs]`` leaves), the plan carry (``PlanState``
    with a leading ``num_envs`` axis), ``first`` (``[num_envs]`` bool, an episode's first step)
    and a key, giving ``(actions [num_envs, A] in [-1, 1], plan, value [num_envs])``: the first
    action of each env's chosen sequence and the best rollout return found.
    """

    def one(sim: Any, t: jax.Array, carry: PlanState, first: jax.Array, key: jax.Array) -> Any:
        value_fn = true_sim_value_fn(env, sim, t)
        result, carry = plan(config, value_fn, carry, first, key)
        return result.actions[0], carry, result.value

    @jax.jit
    def plan_step(env_state: Any, carry: PlanState, first: jax.Array, key: jax.Array) -> Any:
        keys = jax.random.split(key, env.num_envs)
        return jax.vmap(one)(env_state.sim, env_state.time, carry, first, keys)

    return plan_step


# ------------------------------------------------------------------------------- the run


def default_plan_out(run: PlanRunConfig, planner: PlannerConfig) -> str:
    """``runs/plan-<method>-<env>-s<seed>``, the default ``--out``."""
    name = f"plan-{planner.method}-{run.env.split('?')[0]}-s{run.seed}"
    return os.path.join("runs", name.replace(":", "_"))


def latency_stats(seconds: list[float] | np.ndarray) -> dict[str, float]:
    """Median, 90th percentile, mean and max of per-action planning times, in milliseconds."""
    ms = np.asarray(seconds, np.float64) * 1e3
    if ms.size == 0:
        return {"median": float("nan"), "p90": float("nan"), "mean": float("nan"), "max": 0.0}
    return {
        "median": float(np.median(ms)),
        "p90": float(np.percentile(ms, 90)),
        "mean": float(ms.mean()),
        "max": float(ms.max()),
    }


def plan_run(run: PlanRunConfig, planner: PlannerConfig | None = None) -> dict[str, Any]:
    """Plan through ``run.episodes`` episodes of ``run.env`` with the true simulator as model.

    Args:
        run: the env, episodes, seed and run directory.
        planner: the planner's settings (default: ``PlannerConfig()``, TD-MPC2's).

    Returns:
        The summary (also written to ``summary.json``).

    Raises:
        ValueError: ``run.env`` is not a JAX env id, ``run.out`` holds a training run, or
            ``planner.num_policy_samples > 0`` (there is no policy prior).
    """
    from jaxrl.envs.jax_envs import is_jax_env, make_jax_env

    planner = planner or PlannerConfig()
    if not is_jax_env(run.env):
        raise ValueError(
            f"jaxrl plan needs a JAX env whose simulator state can be copied (jax:NAME or "
            f"brax:NAME), got {run.env!r}; e.g. --env jax:pendulum."
        )
    if planner.num_policy_samples:
        raise ValueError(
            "Planning with the true simulator has no policy prior to sample from; "
            "set --num-policy-samples 0."
        )
    out = run.out or default_plan_out(run, planner)
    if os.path.isdir(os.path.join(out, "checkpoints")):
        raise ValueError(f"{out} holds a training run (checkpoints/); use another --out.")
    env = make_jax_env(run.env, 1)
    os.makedirs(out, exist_ok=True)
    config = {
        "agent": planner.method,
        "model": "true_simulator",
        "env": run.env,
        "dataset": None,
        "seed": run.seed,
        "plan": config_to_dict(run),
        "agent_config": config_to_dict(planner),
        "versions": {"jax": jax.__version__},
    }
    write_json(os.path.join(out, "config.json"), config)
    logger = RunLogger(out, run.tensorboard)
    logger.truncate(0)  # a rerun starts over

    key = jax.random.key(run.seed)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    plan_step = make_plan_step(env, planner)
    carry0 = init_plan(planner, env.action_size, (1,))
    t0 = time.perf_counter()
    probe = reset(jax.random.key(0))
    plan_step = plan_step.lower(probe, carry0, jnp.ones(1, bool), key).compile()
    compile_s = time.perf_counter() - t0

    bar = None
    if run.progress:
        from tqdm import tqdm

        bar = tqdm(total=run.episodes * env.episode_length, unit="step", dynamic_ncols=True)
    returns, lengths, latencies = [], [], []
    total_steps, start = 0, time.perf_counter()
    for episode in range(run.episodes):
        key, k_reset = jax.random.split(key)
        env_state, carry = reset(k_reset), carry0
        ret, length, episode_latency = 0.0, 0, []
        while True:
            key, k_plan = jax.random.split(key)
            tic = time.perf_counter()
            action, carry, _ = plan_step(env_state, carry, jnp.full(1, length == 0), k_plan)
            action.block_until_ready()
            episode_latency.append(time.perf_counter() - tic)
            env_state = step(env_state, action)
            ret += float(env_state.reward[0])
            length += 1
            if bar is not None:
                bar.update(1)
            if float(env_state.terminated[0]) + float(env_state.truncation[0]) > 0:
                break
        total_steps += length
        returns.append(ret)
        lengths.append(length)
        latencies += episode_latency
        lat = latency_stats(episode_latency)
        logger.log(
            total_steps,
            {
                "eval_return": ret,
                "episode": float(episode),
                "episode_length": float(length),
                "plan/latency_ms_median": lat["median"],
                "plan/latency_ms_p90": lat["p90"],
            },
        )
        if bar is not None:
            bar.set_postfix({"return": f"{ret:.1f}"}, refresh=False)
    wall = time.perf_counter() - start
    if bar is not None:
        bar.close()
    logger.plot(f"{planner.method} (true simulator) on {run.env}")
    logger.close()
    lat = latency_stats(latencies)
    summary = {
        "agent": planner.method,
        "model": "true_simulator",
        "env": run.env,
        "seed": run.seed,
        "total_steps": total_steps,
        "episodes": run.episodes,
        "episode_returns": returns,
        "episode_lengths": lengths,
        "final_eval_return_mean": float(np.mean(returns)),
        "final_eval_return_std": float(np.std(returns)),
        "normalized_score": None,
        "wall_clock_s": wall,
        "env_steps_per_s": total_steps / max(wall, 1e-9),
        "updates_per_s": 0.0,
        "plan_latency_ms_median": lat["median"],
        "plan_latency_ms_p90": lat["p90"],
        "plan_latency_ms_mean": lat["mean"],
        "plan_latency_ms_max": lat["max"],
        "compile_s": compile_s,
        "completed": True,
    }
    write_json(os.path.join(out, "summary.json"), summary)
    env.close()
    return summary


__all__ = [
    "PlanRunConfig",
    "default_plan_out",
    "latency_stats",
    "make_plan_step",
    "plan_run",
    "true_sim_value_fn",
]
