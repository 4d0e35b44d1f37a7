"""Planning with the true simulator: MPPI / CEM on a JAX env, no learning (``jaxrl plan``).

The model is the environment itself: every candidate action sequence is rolled out from a copy
of the current env state through the same wrapped env the agent acts in (``env.step``, vmapped
over the population), so sim-to-real options of the env id (``?decimation=k``, action delays
and filters, pushes, ...) act on the imagined rollouts exactly as on the real steps, and the
model's time limit counts the same agent steps. A sequence scores the sum of its rewards. This
is the upper bound a learned world model can reach with the same planner settings, and a check
of the planner on its own. Each env step plans (one jitted call), acts with the first action of
the chosen sequence and carries the plan's mean to the next step (warm start). Episodes run one
after another on one env copy (it resets itself when an episode ends), so the time of each
planning call is the latency a controller would see per action.

The loop runs on the training loops' ``Harness``, with the same run directory: ``config.json``;
``metrics.csv`` with one row per episode (``step`` = env steps so far, ``eval_return`` = that
episode's return, its length and planning latency); ``summary.json`` with the training loops'
keys (``final_eval_return_mean`` over the episodes) plus ``episode_returns`` and the planning
latency per action (``plan_latency_ms_median``, ``plan_latency_ms_p90``, ...); TensorBoard
events, ``learning_curve.png`` (return per episode) and ``checkpoints/`` (the env state, the
plan, the RNG and the episodes so far, written after every episode and at a stop). SIGINT or
SIGTERM stops the run after the current step; rerunning the same command resumes it there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.config import check_positive, check_range, config_to_dict
from jaxrl.errors import ConfigError, EnvError
from jaxrl.loops.config import TrainConfig, prepare_run_dir
from jaxrl.loops.device import strongly_typed
from jaxrl.loops.harness import Harness
from jaxrl.planners import PlannerConfig, PlanState, ValueFn, init_plan, plan

TRUE_SIM_PLANNER = PlannerConfig(
    horizon=16, num_samples=64, num_elites=8, iterations=3, max_std=0.5
)
"""``jaxrl plan``'s planner defaults: MPPI, 16 steps (0.8 s of ``jax:pendulum``, 0.64 s of
``brax:inverted_pendulum``), 64 samples, 8 elites, 3 iterations, a starting std of 0.5 (a
quarter of the action range); the other fields as ``PlannerConfig``. TD-MPC2's defaults
(horizon 3) assume a learned value at the end of the horizon; a rollout return alone needs a
horizon long enough to see the task's payoff, as in hydrax's MJX examples (plan horizons of
0.25-1 s, 32-1024 samples). TD-MPC2's starting std of 2 clips most samples to the bounds
(bang-bang), which costs control penalties: ``brax:reacher`` scores -77 to -92 per 200 steps
with it, -30 to -33 with 0.5. On ``jax:pendulum`` these defaults swing up and hold from any
start (every episode of seeds 0-4 > -500; a start near the bottom costs about -250 to -390)."""


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
    """Run directory (default runs/plan-<method>-<env>-s<seed>); resumes if it has a checkpoint."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    video: bool = False
    """Render every episode to DIR/videos/episode_<k>.mp4 and TensorBoard (320x240, real time;
    an episode a stop interrupted is filmed from where the run resumed)."""

    def __post_init__(self) -> None:
        check_positive(self, "episodes")
        check_range(self, "seed", 0, 2**31 - 1)


class PlanLoopState(struct.PyTreeNode):
    """What the planning loop carries and checkpoints.

    Attributes:
        env: the env state (one copy), mid-episode where a run stopped.
        plan: the planner's carry (``PlanState`` with a leading env axis of 1).
        key: the loop's RNG (one split per planning call).
        nonfinite: always 0 (no updates); the harness reads it when checkpointing.
    """

    env: Any
    plan: PlanState
    key: jax.Array
    nonfinite: jax.Array = np.int32(0)


# ------------------------------------------------------------------------------ the model


def true_sim_value_fn(env: Any, state: Any) -> ValueFn:
    """``value_fn`` scoring action sequences by rolling out copies of one env's state.

    The value of a sequence is the undiscounted sum of the rewards ``env.step`` gives for its
    steps from ``state``, wrappers included. Steps after the episode ended (a termination, or
    the env's time limit, in agent steps) do not count.

    Args:
        env: a ``make_jax_env`` env with one copy (``num_envs == 1``).
        state: its ``EnvState`` (leaves with a leading env axis of 1).

    Returns:
        ``value_fn(actions [N, H, A] in [-1, 1], key) -> [N]``.
    """

    def rollout(actions: jax.Array) -> jax.Array:
        def step(carry: tuple[Any, jax.Array], action: jax.Array) -> tuple[Any, jax.Array]:
            s, alive = carry
            s = env.step(s, action[None])
            reward = jnp.where(alive, s.reward[0], 0.0)  # also drops NaNs of a terminated state
            alive = alive & (s.terminated[0] + s.truncation[0] == 0)
            return (s, alive), reward

        _, rewards = jax.lax.scan(step, (state, jnp.asarray(True)), actions)
        return jnp.sum(rewards)

    return lambda actions, key: jax.vmap(rollout)(actions)


def make_plan_step(env: Any, config: PlannerConfig) -> Any:
    """The jitted planning call: ``(env_state, plan, first, key) -> (action, plan, value)``.

    Args:
        env: a ``make_jax_env`` env with one copy: the env acted in is also the model.
        config: the planner's settings.

    Returns:
        A function of the env state, the plan carry (``PlanState`` with a leading axis of 1),
        ``first`` (``[1]`` bool, an episode's first step) and a key, giving ``(action [1, A]
        in [-1, 1], plan, value [1])``: the first action of the chosen sequence and the best
        rollout return found.

    Raises:
        ValueError: ``env`` has more than one copy.
    """
    if env.num_envs != 1:
        raise ValueError(f"make_plan_step plans for an env with one copy, got {env.num_envs}.")

    @jax.jit
    def plan_step(env_state: Any, carry: PlanState, first: jax.Array, key: jax.Array) -> Any:
        one = jax.tree.map(lambda x: x[0], carry)
        result, one = plan(config, true_sim_value_fn(env, env_state), one, first[0], key)
        batch = lambda x: x[None]  # noqa: E731
        return result.actions[0][None], jax.tree.map(batch, one), result.value[None]

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


def plan_config(run: PlanRunConfig, planner: PlannerConfig) -> dict[str, Any]:
    """The resolved settings recorded in ``config.json`` (``model``: ``true_simulator``)."""
    return {
        "agent": planner.method,
        "model": "true_simulator",
        "env": run.env,
        "dataset": None,
        "seed": run.seed,
        "plan": config_to_dict(run),
        "agent_config": config_to_dict(planner),
        "versions": {"jax": jax.__version__},
    }


def plan_run(run: PlanRunConfig, planner: PlannerConfig | None = None) -> dict[str, Any]:
    """Plan through ``run.episodes`` episodes of ``run.env`` with the true simulator as model.

    Resumes from ``run.out``'s newest checkpoint when there is one.

    Args:
        run: the env, episodes, seed and run directory.
        planner: the planner's settings (default: ``TRUE_SIM_PLANNER``).

    Returns:
        The summary (also written to ``summary.json``); ``completed`` is False after a stop
        signal.

    Raises:
        ValueError: ``run.env`` is not a JAX env id, ``run.out`` holds a training run or a
            plan run with other settings, or ``planner.num_policy_samples > 0`` (there is no
            policy prior).
    """
    from jaxrl.envs.jax_envs import is_jax_env, make_jax_env

    planner = planner or TRUE_SIM_PLANNER
    if not is_jax_env(run.env):
        raise EnvError(
            f"jaxrl plan needs a JAX env whose simulator state can be copied (jax:NAME or "
            f"brax:NAME), got {run.env!r}; e.g. --env jax:pendulum."
        )
    if planner.num_policy_samples:
        raise ConfigError(
            "Planning with the true simulator has no policy prior to sample from; "
            "set --num-policy-samples 0."
        )
    out = run.out or default_plan_out(run, planner)
    if os.path.isdir(os.path.join(out, "checkpoints")) and not _is_plan_run(out):
        raise ConfigError(f"{out} holds a training run (checkpoints/); use another --out.")
    if run.video:  # before the run directory is made
        from jaxrl.loops.video import check_rendering

        check_rendering(run.env)
    env = make_jax_env(run.env, 1)
    try:
        prepare_run_dir(out, plan_config(run, planner))
        return _plan_episodes(env, run, planner, out)
    finally:
        env.close()


def _film(env: Any, env_id: str, clip: list, h: Harness, name: str) -> None:
    """Render one episode's simulator states (``clip``) to ``videos/<name>.mp4`` and TensorBoard."""
    from jaxrl.envs.render import frame_rate, render_data, render_frames
    from jaxrl.loops.video import save_video

    data = [render_data(env.core, sim) for sim in clip]
    frames = render_frames(env.core, jax.tree.map(lambda *x: np.stack(x), *data), 320, 240)
    save_video(h.loggers[0], h.step, name, frames, frame_rate(env_id, env.core))


def _is_plan_run(out: str) -> bool:
    """True when ``out/config.json`` records a ``jaxrl plan`` run."""
    try:
        with open(os.path.join(out, "config.json")) as f:
            return json.load(f).get("model") == "true_simulator"
    except (OSError, ValueError, AttributeError):
        return False


def _plan_episodes(env: Any, run: PlanRunConfig, planner: PlannerConfig, out: str) -> dict:
    """The loop of ``plan_run`` on a harness over ``out``: plan, act, and per episode a row."""
    budget = run.episodes * env.episode_length  # no episode is longer
    cfg = TrainConfig(
        env=run.env,
        total_steps=budget,
        seed=run.seed,
        eval_every=budget,  # the rows and checkpoints come at episode ends
        log_every=budget,
        checkpoint_every=budget,
        progress=run.progress,
        tensorboard=run.tensorboard,
    )
    h = Harness(planner.method, cfg, [out], phase="plan", where=f"{run.env} (true simulator)")
    key, k_reset = jax.random.split(jax.random.key(run.seed))
    fresh = PlanLoopState(env.reset(k_reset), init_plan(planner, env.action_size, (1,)), key)
    state, metas = h.resume(strongly_typed(fresh))
    state = jax.device_put(state, jax.devices()[0])
    meta = metas[0] if metas else {}
    returns, lengths = list(meta.get("returns", [])), list(meta.get("lengths", []))
    latencies = list(meta.get("latency_s", []))
    if len(returns) >= run.episodes:
        h.end_budget_here()
    if (done := h.completed()) is not None:
        return done[0]

    step = jax.jit(env.step)
    t0 = time.perf_counter()
    first = state.env.extras["episode"]["length"] == 0
    plan_step = make_plan_step(env, planner)
    plan_step = plan_step.lower(state.env, state.plan, first, state.key).compile()
    compile_s = time.perf_counter() - t0

    def record() -> dict[str, Any]:
        return {"returns": returns, "lengths": lengths, "latency_s": latencies}

    saved, clip = None, []
    with h:
        while h.running():
            key, k_plan = jax.random.split(state.key)
            first = state.env.extras["episode"]["length"] == 0  # the env's agent steps
            tic = time.perf_counter()
            action, carry, _ = plan_step(state.env, state.plan, first, k_plan)
            action.block_until_ready()
            latencies.append(time.perf_counter() - tic)
            if run.video:  # what this step's frame needs, before the step
                clip.append(jax.device_get(jax.tree.map(lambda x: x[0], state.env.sim)))
            state = state.replace(env=step(state.env, action), plan=carry, key=key)
            h.advance(1)
            info = jax.device_get(state.env.info)
            length = int(info["episode_length"][0])  # nonzero where an episode just ended
            if length:
                returns.append(float(info["episode_return"][0]))
                lengths.append(length)
                lat = latency_stats(latencies[-length:])
                row = {"episode": float(len(returns) - 1), "episode_length": float(length)}
                row |= {"plan/latency_ms_median": lat["median"], "plan/latency_ms_p90": lat["p90"]}
                row["time/env_steps_per_s"] = h.rate()
                h.record_eval([returns[-1]], row)
                if clip:
                    _film(env, run.env, clip, h, f"episode_{len(returns) - 1}")
                    clip = []
                if len(returns) >= run.episodes:
                    h.end_budget_here()
                h.log(row)
                h.save(state, record())
                saved = h.step
        if h.stop.raised and saved != h.step:
            h.save(state, record())
    lat = latency_stats(latencies)
    extra: dict[str, Any] = {
        "model": "true_simulator",
        "episodes": len(returns),
        "episode_returns": returns,
        "episode_lengths": lengths,
        "updates_per_s": 0.0,
        "plan_latency_ms_median": lat["median"],
        "plan_latency_ms_p90": lat["p90"],
        "plan_latency_ms_mean": lat["mean"],
        "plan_latency_ms_max": lat["max"],
        "compile_s": compile_s,
    }
    if len(returns) >= run.episodes:
        extra["final_eval_return_mean"] = float(np.mean(returns))
        extra["final_eval_return_std"] = float(np.std(returns))
    return h.finish(extra)[0]


__all__ = [
    "PlanLoopState",
    "PlanRunConfig",
    "TRUE_SIM_PLANNER",
    "default_plan_out",
    "latency_stats",
    "make_plan_step",
    "plan_config",
    "plan_run",
    "true_sim_value_fn",
]
