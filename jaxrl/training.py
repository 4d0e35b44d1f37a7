"""The host training loop (Gymnasium envs) and evaluation, shared by every agent.

Per environment step the loop makes one jitted call to act and one to add the transition to the
device-resident replay buffer and run ``utd_ratio * num_envs`` fused updates (``lax.scan``). The
buffer and agent are donated to that call, so nothing is copied between host and device except
the new transition and the action.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections import deque
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.buffers import (
    BufferState,
    buffer_add,
    buffer_sample,
    make_replay_buffer,
    sample_minibatches,
    set_rows,
)
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import check_positive, check_range, config_to_dict
from jaxrl.envs.gym import HostEnv
from jaxrl.episodes import EpisodeTracker, episode_fields, pad_rows
from jaxrl.logging import RunLogger, write_json
from jaxrl.types import Rollout, Transition


@partial(dataclasses.dataclass, frozen=True)
class TrainConfig:
    """Options of the training loop (the agent's hyperparameters live in its own config)."""

    env: str = "Pendulum-v1"
    """Environment id: 'HalfCheetah-v5' (Gymnasium), 'brax:ant', 'jax:pendulum'. With --dataset
    and no --env, the dataset's env."""
    dataset: str | None = None
    """Offline data: a D4RL-format .hdf5 file, a Minari dataset directory, or minari:ID."""
    offline_steps: int | None = None
    """With --dataset: offline gradient steps before going online (default: --total-steps)."""
    online_steps: int | None = None
    """With --dataset: env steps online after the offline phase (rlpd: the run's env steps)."""
    offline_ratio: float = 0.5
    """Online with --dataset: share of each minibatch from the dataset (0 = drop it online)."""
    total_steps: int = 100_000
    """Environment steps to train for (summed over parallel envs); offline: gradient steps."""
    seed: int = 0
    """Seed of the agent, the environments and the loop."""
    num_envs: int | None = None
    """Parallel environment copies (default: 1 for Gymnasium envs, 64 for JAX envs)."""
    num_seeds: int = 1
    """Train this many seeds (seed, seed+1, ...) at once with jax.vmap (JAX envs only)."""
    updates_per_step: int | None = None
    """Gradient steps per vectorized env step (off-policy); default utd_ratio x num_envs."""
    out: str | None = None
    """Run directory (default runs/<agent>-<env>-s<seed>); resumes if it has a checkpoint."""
    eval_every: int = 10_000
    """Evaluate the deterministic policy every this many environment steps."""
    eval_episodes: int = 10
    """Episodes per evaluation (run in parallel, one per eval env copy)."""
    log_every: int = 1_000
    """Log training metrics every this many environment steps."""
    checkpoint_every: int | None = None
    """Checkpoint every this many environment steps; default = eval_every."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb_project: str | None = None
    """Also log to this wandb project (opt-in; needs the wandb extra)."""

    def __post_init__(self) -> None:
        check_positive(
            self,
            "total_steps",
            "num_envs",
            "num_seeds",
            "updates_per_step",
            "eval_every",
            "eval_episodes",
            "log_every",
            "checkpoint_every",
            "online_steps",
        )
        check_range(self, "seed", 0, 2**31 - 1)
        if self.offline_steps is not None:
            check_range(self, "offline_steps", 0, float("inf"))
        check_range(self, "offline_ratio", 0.0, 1.0)


class LoopState(struct.PyTreeNode):
    """Device-side loop state (what a checkpoint stores): agent, replay buffer, update RNG."""

    agent: Any
    buffer: BufferState
    rng: jax.Array


def init_loop_state(agent: Any, env: HostEnv, seed: int) -> LoopState:
    """Loop state for ``agent`` on ``env``: an empty buffer of the agent's size and an RNG.

    It is also the template a checkpoint is restored into. The buffer has the optional
    ``next_action`` / ``mc_return`` fields when the agent's config needs them (``episode_fields``).
    """
    with_next, with_mc = episode_fields(agent.config)
    example = Transition(
        env.obs_example,
        env.action_example,
        np.float32(0),
        env.obs_example,
        np.float32(0),
        next_action=np.zeros_like(env.action_example) if with_next else None,
        mc_return=np.float32(0) if with_mc else None,
    )
    buffer = make_replay_buffer(agent.config.buffer_size)
    return LoopState(agent, buffer.init(example), jax.random.key(seed + 1))


def _update_step(
    agent: Any,
    rng: jax.Array,
    buffer: BufferState,
    prior: BufferState | None,
    *,
    num_updates: int,
    batch_size: int,
    prior_ratio: float = 0.0,
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """Run ``num_updates`` gradient steps under ``lax.scan`` on minibatches from ``buffer``.

    With ``prior`` (offline data) each minibatch mixes ``prior_ratio`` of its rows from it.

    The buffer is a read-only argument here and is written only by the separate ``buffer_add``
    call: when one XLA program both writes the donated buffer in place and gathers minibatches
    from it, XLA inserts full copies of the buffer (measured: 8 ms -> 40-70 ms per step with
    1M rows on CPU).
    """
    rng, key = jax.random.split(rng)
    batches = sample_minibatches(buffer, key, num_updates, batch_size, prior, prior_ratio)
    agent, infos = jax.lax.scan(lambda a, b: a.update(b), agent, batches)
    return agent, rng, jax.tree.map(lambda x: x[-1], infos)


def _act(agent: Any, obs: jax.Array, key: jax.Array, step: jax.Array) -> jax.Array:
    """Exploration actions for the env step numbered ``step`` (the key is folded, not carried)."""
    return agent.sample_actions(obs, jax.random.fold_in(key, step))


def _update_and_act(
    agent: Any,
    rng: jax.Array,
    buffer: BufferState,
    prior: BufferState | None,
    obs: jax.Array,
    act_key: jax.Array,
    step: jax.Array,
    **sizes: Any,
) -> tuple[Any, jax.Array, dict[str, jax.Array], jax.Array]:
    """``_update_step`` then the next exploration action, in one call (one dispatch per step)."""
    agent, rng, info = _update_step(agent, rng, buffer, prior, **sizes)
    return agent, rng, info, _act(agent, obs, act_key, step)


def _add(buffer: BufferState, items: Transition, previous_rows: jax.Array | None) -> BufferState:
    """``buffer_add``, and with ``previous_rows`` set those rows' ``next_action``.

    ``previous_rows`` are each env's previous step in the same episode (``EpisodeTracker``);
    the new actions are their next actions.
    """
    buffer = buffer_add(buffer, items)
    if previous_rows is not None:
        buffer = set_rows(buffer, "next_action", previous_rows, items.action)
    return buffer


def evaluate(agent: Any, env: HostEnv, seed: int, act_fn: Any = None) -> np.ndarray:
    """Run one deterministic episode in each copy of ``env``; returns the ``[num_envs]`` returns.

    Every copy is reset with a fixed seed, so an evaluation depends only on the agent's parameters.
    """
    act_fn = act_fn or jax.jit(lambda a, o: a.eval_actions(o))
    obs = env.reset(seed=seed)
    returns = np.zeros(env.num_envs)
    running = np.ones(env.num_envs, bool)
    while running.any():
        action = np.asarray(act_fn(agent, obs))
        _, obs, reward, terminated, truncated = env.step(action)
        returns += reward * running
        running &= ~(terminated | truncated)
    return returns


def _crossed(step: int, n: int, every: int, total: int) -> bool:
    """True when the last ``n`` steps (ending at ``step``) crossed a multiple of ``every``."""
    return step % every < n or step >= total


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps, so state is saved consistently."""

    def __init__(self) -> None:
        self.raised = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: keep default handling
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.raised:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.raised = True

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def run_config(agent_name: str, agent_config: Any, cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config recorded in ``config.json``."""
    import flax
    import gymnasium

    return {
        "agent": agent_name,
        "env": cfg.env,
        "dataset": cfg.dataset,
        "seed": cfg.seed,
        "train": config_to_dict(cfg),
        "agent_config": config_to_dict(agent_config),
        "versions": {
            "jax": jax.__version__,
            "flax": flax.__version__,
            "gymnasium": gymnasium.__version__,
        },
    }


def default_out(agent_name: str, cfg: TrainConfig) -> str:
    """``runs/<agent>-<dataset or env>-s<seed>``, the default ``--out``."""
    seeds = f"s{cfg.seed}" if cfg.num_seeds == 1 else f"s{cfg.seed}-{cfg.seed + cfg.num_seeds - 1}"
    where = cfg.env.split("?")[0]
    if cfg.dataset:
        where = os.path.splitext(os.path.basename(os.path.normpath(cfg.dataset)))[0]
    name = f"{agent_name}-{where}-{seeds}"
    return os.path.join("runs", name.replace(":", "_"))


def prepare_run_dir(out: str, config: dict[str, Any]) -> None:
    """Create ``out`` and write ``config.json``; refuse to resume a run with another config."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "config.json")
    config = json.loads(json.dumps(config))  # tuples -> lists, as they are stored
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # Budgets may grow (resume a finished run for longer; fine-tune an offline run online).
        ignore = {"total_steps", "online_steps", "offline_ratio", "progress", "out"}
        ignore |= {"wandb_project", "tensorboard"}
        for section in ("agent", "env", "seed", "agent_config", "train"):
            a, b = old.get(section), config.get(section)
            if isinstance(a, dict) and isinstance(b, dict):
                diff = [k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k)]
            else:
                diff = [] if a == b else [section]
            if diff:
                raise ValueError(
                    f"{out} holds a run with a different configuration ({section}: "
                    f"{', '.join(sorted(map(str, diff)))}). Use a new --out directory, or the "
                    "same options as before to resume."
                )
    write_json(path, config)


def train_host(
    agent: Any,
    env: HostEnv,
    eval_env: HostEnv,
    cfg: TrainConfig,
    out: str,
    agent_name: str = "agent",
    *,
    prior: BufferState | None = None,
    prior_ratio: float = 0.5,
    step_offset: int = 0,
    score_fn: Any = None,
) -> dict[str, Any]:
    """Train ``agent`` online on host envs, resuming from ``out/checkpoints`` if present.

    The same loop runs RLPD (``prior`` = a dataset mixed into every minibatch) and the online
    phase of offline-to-online training (``agent`` = the pretrained agent, optimizer states
    included, and ``step_offset`` = its offline gradient steps).

    Args:
        agent: the agent to train (its config gives batch_size, utd_ratio, buffer_size and
            learning_starts); fresh, or pretrained offline.
        env: training envs (``cfg.num_envs`` copies).
        eval_env: evaluation envs (``cfg.eval_episodes`` copies).
        cfg: loop options; ``total_steps`` counts the env steps of this loop.
        out: run directory (config.json must already be there, see ``prepare_run_dir``).
        agent_name: name recorded in summary.json.
        prior: offline data (a full buffer state with the online buffer's fields), or None.
        prior_ratio: fraction of each minibatch drawn from ``prior``.
        step_offset: offline gradient steps that came before: metrics rows and checkpoints are
            numbered ``step_offset + env step`` and rows get an ``env_step`` column.
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).

    Returns:
        The summary written to ``out/summary.json``.
    """
    acfg = agent.config
    n = env.num_envs
    score_fn = score_fn or (lambda _: None)
    state = init_loop_state(agent, env, cfg.seed)
    with_next, with_mc = episode_fields(acfg)
    tracker = None
    if with_next or with_mc:
        tracker = EpisodeTracker(n, acfg.buffer_size, float(getattr(acfg, "discount", 1.0)))
    act_key = jax.random.key(cfg.seed + 2)
    np_rng = np.random.default_rng(cfg.seed)
    obs = env.reset(seed=cfg.seed)
    step, ep_return, ep_length = 0, np.zeros(n), np.zeros(n, np.int64)
    pending: Any = None  # the policy's action for the next step, computed with the last update
    recent: deque[float] = deque(maxlen=20)
    logger = RunLogger(out, cfg.tensorboard, cfg.wandb_project, os.path.basename(out))
    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    latest = ckpt.latest_step()
    # An offline-to-online run's directory starts with the offline phase's checkpoints.
    phase = None if latest is None else ckpt.meta(latest).get("phase")
    if latest is not None and (phase or ("offline" if step_offset else "online")) == "online":
        state, meta = ckpt.restore(state)
        step = int(meta["step"])
        np_rng.bit_generator.state = meta["np_rng"]
        ep_return, ep_length = np.array(meta["ep_return"]), np.array(meta["ep_length"], np.int64)
        recent.extend(meta["recent_returns"])
        if meta.get("pending_action") is not None:
            pending = np.asarray(meta["pending_action"], np.float32)
        if meta.get("env_state") is not None and env.savable:
            obs = env.set_state(meta["env_state"])
            if tracker is not None:
                tracker.load(meta["episodes"])
        else:
            ep_return[:], ep_length[:], pending = 0.0, 0, None  # the saved action was for old obs
            if tracker is not None:
                tracker.load(meta["episodes"])
                tracker.forget_running()
            print(
                f"Resumed at step {step}: {env.env_id} cannot save its simulator state, so the "
                "interrupted episodes restart from a reset (the run is not bit-identical)."
            )
        logger.truncate(step_offset + step)
        print(f"Resuming {out} from step {step_offset + step}.")
    else:
        logger.truncate(step_offset)

    def save() -> None:
        meta = {
            "step": step,
            "np_rng": np_rng.bit_generator.state,
            "ep_return": ep_return.tolist(),
            "ep_length": ep_length.tolist(),
            "recent_returns": list(recent),
            "env_state": env.get_state(),
            "pending_action": None if pending is None else np.asarray(pending).tolist(),
            "phase": "online",
            "step_offset": step_offset,
            "episodes": None if tracker is None else tracker.state(),
        }
        ckpt.save(step_offset + step, state, meta)

    num_updates = acfg.utd_ratio * n
    sizes = {"num_updates": num_updates, "batch_size": acfg.batch_size, "prior_ratio": prior_ratio}
    update_fn = jax.jit(partial(_update_and_act, **sizes), donate_argnums=(0, 1))
    add_fn = jax.jit(_add, donate_argnums=0)
    mc_fn = jax.jit(partial(set_rows, field="mc_return"), donate_argnums=0)
    no_next_action = np.zeros((n, env.action_dim), np.float32) if with_next else None
    unknown_return = np.full(n, -np.inf, np.float32) if with_mc else None
    act_fn = jax.jit(_act)
    eval_fn = jax.jit(lambda a, o: a.eval_actions(o))
    ckpt_every = cfg.checkpoint_every or cfg.eval_every
    start_step, start_time, updates = step, time.perf_counter(), 0
    last_log = (step, start_time)
    info: dict[str, Any] = {}
    evals = [r for r in logger.rows if "eval_return" in r]
    last_eval = (
        (evals[-1]["eval_return"], evals[-1].get("eval_return_std", float("nan")))
        if evals
        else (float("nan"), float("nan"))
    )
    done_already = _completed_summaries([out], step, cfg.total_steps)
    if done_already is not None:
        logger.close()
        return done_already[0]
    bar = _progress_bar(cfg, step)

    with _StopFlag() as stop:
        while step < cfg.total_steps and not stop.raised:
            if step < acfg.learning_starts:
                action = np_rng.uniform(-1.0, 1.0, (n, env.action_dim)).astype(np.float32)
            else:
                if pending is None:  # first policy step; afterwards update_fn computes it
                    pending = act_fn(state.agent, obs, act_key, step)
                action = np.asarray(pending)
            next_obs, new_obs, reward, terminated, truncated = env.step(action)
            transition = Transition(
                obs,
                action,
                reward,
                next_obs,
                terminated.astype(np.float32),
                next_action=no_next_action,
                mc_return=unknown_return,
            )
            previous = None
            if tracker is not None:
                previous = tracker.previous_rows() if with_next else None
                tracker.next_rows()
            state = state.replace(buffer=add_fn(state.buffer, transition, previous))
            if tracker is not None:
                for rows, returns in tracker.record(reward, terminated | truncated):
                    if with_mc:
                        rows, returns = pad_rows(rows, returns, acfg.buffer_size)
                        state = state.replace(buffer=mc_fn(state.buffer, rows=rows, values=returns))
            obs, learn = new_obs, step >= acfg.learning_starts
            step += n
            if learn:
                agent_, rng_, info, pending = update_fn(
                    state.agent, state.rng, state.buffer, prior, obs, act_key, step
                )
                state = state.replace(agent=agent_, rng=rng_)
                updates += num_updates
            ep_return += reward
            ep_length += 1
            for i in np.flatnonzero(terminated | truncated):
                recent.append(float(ep_return[i]))
                ep_return[i], ep_length[i] = 0.0, 0
            if bar is not None:
                bar.update(n)

            at_eval = _crossed(step, n, cfg.eval_every, cfg.total_steps)
            if at_eval or _crossed(step, n, cfg.log_every, cfg.total_steps):
                now = time.perf_counter()
                row = {k: float(v) for k, v in jax.device_get(info).items()}
                if recent:
                    row["train/episode_return"] = float(np.mean(recent))
                # Rate over the last log interval (evaluation time excluded).
                row["time/env_steps_per_s"] = (step - last_log[0]) / max(now - last_log[1], 1e-9)
                if at_eval:
                    returns = evaluate(state.agent, eval_env, cfg.seed + 10_000, eval_fn)
                    last_eval = (float(returns.mean()), float(returns.std()))
                    row["eval_return"], row["eval_return_std"] = last_eval
                    score = score_fn(last_eval[0])
                    if score is not None:
                        row["eval_normalized_score"] = score
                if step_offset:
                    row["env_step"] = step
                logger.log(step_offset + step, row)
                last_log = (step, time.perf_counter())
                if bar is not None:
                    bar.set_postfix(
                        sps=f"{row['time/env_steps_per_s']:.0f}",
                        eval=f"{last_eval[0]:.1f}",
                        refresh=False,
                    )
            if _crossed(step, n, ckpt_every, cfg.total_steps):
                save()
        if stop.raised:
            save()
    wall = time.perf_counter() - start_time
    _close_run(bar, {f"{agent_name} on {cfg.env}": logger}, step, cfg.total_steps)
    summary = _summary(agent_name, cfg, cfg.seed, step, last_eval, wall, start_step, updates)
    if prior is not None or step_offset:
        summary |= {"dataset": cfg.dataset, "offline_steps": step_offset, "online_steps": step}
        summary["normalized_score"] = score_fn(last_eval[0]) if summary["completed"] else None
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


def _summary(
    agent_name: str,
    cfg: TrainConfig,
    seed: int,
    step: int,
    last_eval: tuple[float, float],
    wall: float,
    start_step: int,
    updates: int,
) -> dict[str, Any]:
    """The ``summary.json`` of one run (DESIGN.md's run-directory contract)."""
    completed = step >= cfg.total_steps
    return {
        "agent": agent_name,
        "env": cfg.env,
        "seed": seed,
        "total_steps": step,
        "final_eval_return_mean": float(last_eval[0]) if completed else None,
        "final_eval_return_std": float(last_eval[1]) if completed else None,
        "normalized_score": None,
        "wall_clock_s": wall,
        "env_steps_per_s": (step - start_step) / max(wall, 1e-9),
        "updates_per_s": updates / max(wall, 1e-9),
        "completed": completed,
    }


def _completed_summaries(outs: list[str], step: int, total_steps: int) -> list[dict] | None:
    """The existing summaries if every run in ``outs`` already finished ``step`` steps."""
    if step < total_steps:
        return None
    summaries = []
    for out in outs:
        path = os.path.join(out, "summary.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            summary = json.load(f)
        if not (summary.get("completed") and summary.get("total_steps") == step):
            return None
        summaries.append(summary)
    print(f"{', '.join(outs)} already completed {step} steps; nothing to do.")
    return summaries


def _close_run(bar: Any, loggers: dict[str, RunLogger], step: int, total_steps: int) -> None:
    """End of a loop: close the bar, plot and close each logger (keyed by plot title)."""
    if bar is not None:
        bar.close()
    for title, logger in loggers.items():
        logger.plot(title)
        logger.close()
    if step < total_steps:
        print(f"Stopped at step {step}; checkpoint saved. Rerun the same command to resume.")


def _progress_bar(cfg: TrainConfig, step: int) -> Any:
    """A tqdm bar over env steps (None when ``cfg.progress`` is off)."""
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.total_steps, initial=step, unit="step", dynamic_ncols=True)


# ------------------------------------------------------------------------------------ fused loop


class FusedState(struct.PyTreeNode):
    """Everything the fused loop carries for one seed (what its checkpoint stores).

    Attributes:
        agent: the agent.
        buffer: replay buffer (None for on-policy agents).
        env: the training envs' state (simulators, wrappers such as the observation normalizer).
        rng: loop RNG (exploration, uniform warm-up actions, minibatch sampling).
    """

    agent: Any
    buffer: BufferState | None
    env: Any
    rng: jax.Array


def init_fused_state(agent_cls: Any, agent_config: Any, env: Any, seed: Any) -> FusedState:
    """Fresh state for one seed; ``seed`` may be traced, so seeds can be created under vmap."""
    obs = jnp.zeros(env.observation_size, jnp.float32)
    act = jnp.zeros(env.action_size, jnp.float32)
    agent = agent_cls.create(agent_config, obs, act, seed)
    key = jax.random.fold_in(jax.random.key(seed), 7)
    k_env, k_loop = jax.random.split(key)
    buffer = None
    if not getattr(agent_cls, "on_policy", False):
        example = Transition(obs, act, jnp.float32(0), obs, jnp.float32(0))
        buffer = make_replay_buffer(agent_config.buffer_size).init(example)
    return FusedState(agent, buffer, env.reset(k_env), k_loop)


def _episode_stats(env_state: Any) -> tuple[jax.Array, jax.Array]:
    """(sum of returns, count) of the episodes that ended on the last step."""
    ended = (env_state.done + env_state.truncation) > 0
    return jnp.sum(env_state.info["episode_return"] * ended), jnp.sum(ended.astype(jnp.float32))


def _off_policy_iteration(
    state: FusedState, step: jax.Array, *, env: Any, num_updates: int
) -> tuple[FusedState, tuple[Any, ...]]:
    """Act in every env, step, add the transitions, then ``num_updates`` gradient steps."""
    acfg = state.agent.config
    rng, k_act, k_rand = jax.random.split(state.rng, 3)
    obs = state.env.obs
    warmup = jax.random.uniform(k_rand, (env.num_envs, env.action_size), minval=-1.0, maxval=1.0)
    action = jnp.where(step < acfg.learning_starts, warmup, state.agent.sample_actions(obs, k_act))
    env_state = env.step(state.env, action)
    transition = Transition(
        obs, action, env_state.reward, env_state.info["final_obs"], env_state.done
    )
    buffer = buffer_add(state.buffer, transition)

    def learn(agent: Any, rng: jax.Array) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        sizes = {"num_updates": num_updates, "batch_size": acfg.batch_size}
        return _update_step(agent, rng, buffer, None, **sizes)

    def skip(agent: Any, rng: jax.Array) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        shapes = jax.eval_shape(learn, agent, rng)[2]
        return agent, rng, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    agent, rng, info = jax.lax.cond(step >= acfg.learning_starts, learn, skip, state.agent, rng)
    return FusedState(agent, buffer, env_state, rng), (info, *_episode_stats(env_state))


def _on_policy_iteration(
    state: FusedState, step: jax.Array, *, env: Any, rollout_length: int
) -> tuple[FusedState, tuple[Any, ...]]:
    """Collect ``rollout_length`` steps in every env, then one agent update on that rollout."""
    del step

    def env_step(carry: tuple[Any, jax.Array], _: Any) -> tuple[Any, Any]:
        env_state, rng = carry
        rng, key = jax.random.split(rng)
        obs = env_state.obs
        action, extras = state.agent.policy_step(obs, key)
        env_state = env.step(env_state, action)
        rollout = Rollout(
            obs=obs,
            action=action,
            extras=extras,
            reward=env_state.reward,
            terminated=env_state.done,
            truncated=env_state.truncation,
            next_obs=env_state.info["final_obs"],
        )
        return (env_state, rng), (rollout, _episode_stats(env_state))

    (env_state, rng), (rollout, (ret, count)) = jax.lax.scan(
        env_step, (state.env, state.rng), None, length=rollout_length
    )
    agent, info = state.agent.update(rollout)
    return state.replace(agent=agent, env=env_state, rng=rng), (info, ret.sum(), count.sum())


def _chunk(
    states: FusedState, step: jax.Array, *, iteration: Any, num_iters: int, steps_per_iter: int
) -> tuple[FusedState, dict[str, jax.Array]]:
    """``num_iters`` loop iterations of every seed (leading axis of ``states``) in one program."""

    def body(carry: tuple[FusedState, jax.Array], _: Any) -> tuple[Any, Any]:
        states, step = carry
        if jax.tree.leaves(states)[0].shape[0] == 1:
            # One seed: run unbatched (vmap over a size-1 axis makes XLA emit batched
            # matmuls and scatters that are measurably slower on CPU).
            state, out = iteration(jax.tree.map(lambda x: x[0], states), step)
            new_states, out = jax.tree.map(lambda x: x[None], (state, out))
        else:
            new_states, out = jax.vmap(iteration, in_axes=(0, None))(states, step)
        # Keep the carry's types exactly (simulators may return weakly typed leaves, e.g. Brax's
        # reward), so the next chunk call does not recompile.
        states = jax.tree.map(
            lambda n, o: jax.lax.convert_element_type(n, o.dtype), new_states, states
        )
        return (states, step + steps_per_iter), out

    (states, _), (infos, ret, count) = jax.lax.scan(body, (states, step), None, length=num_iters)
    metrics = {k: v[-1] for k, v in infos.items()}
    metrics["train/episode_return_sum"] = ret.sum(0)
    metrics["train/episodes"] = count.sum(0)
    return states, metrics


def evaluate_jax(agent: Any, env: Any, key: jax.Array, obs_stats: Any = None) -> jax.Array:
    """Return of the first episode of each copy of ``env`` under the deterministic policy.

    ``env`` runs ``env.episode_length`` steps (one episode at most per copy; later ones are
    ignored). With a frozen ``NormalizeObservation`` wrapper, pass the training ``obs_stats``.
    Pure: jit it, or vmap it over seeds.
    """
    state = env.reset(key)
    if obs_stats is not None:
        state = env.with_stats(state, obs_stats)

    def body(carry: tuple[Any, jax.Array, jax.Array], _: Any) -> tuple[Any, None]:
        state, ret, alive = carry
        state = env.step(state, agent.eval_actions(state.obs))
        ret = ret + state.reward * alive
        alive = alive * (1.0 - jnp.maximum(state.done, state.truncation))
        return (state, ret, alive), None

    ones = jnp.ones(env.num_envs, jnp.float32)
    (_, ret, _), _ = jax.lax.scan(body, (state, 0.0 * ones, ones), None, length=env.episode_length)
    return ret


def _obs_stats(env_state: Any) -> Any:
    return env_state.extras.get("obs_stats")


def train_fused(
    agent_cls: Any,
    agent_config: Any,
    env: Any,
    eval_env: Any,
    cfg: TrainConfig,
    outs: list[str],
    agent_name: str = "agent",
) -> list[dict[str, Any]]:
    """Train ``len(outs)`` seeds (``cfg.seed + i``) on a JAX env as one program per chunk.

    Each chunk is ``lax.scan`` over loop iterations, vmapped over seeds: off-policy agents act,
    step, add to their buffer and take ``updates_per_step`` gradient steps per iteration;
    on-policy agents (``agent_cls.on_policy``) collect a rollout and update on it. Between chunks
    the host logs, evaluates, checkpoints and advances the progress bar. Each seed writes its own
    run directory (``outs[i]``), which is also a valid single-seed run: it resumes and evaluates
    on its own.

    Returns:
        The per-seed summaries (also written to ``outs[i]/summary.json``).
    """
    num_seeds = len(outs)
    seeds = jnp.arange(num_seeds, dtype=jnp.int32) + cfg.seed
    on_policy = getattr(agent_cls, "on_policy", False)
    n = env.num_envs
    if on_policy:
        template = init_fused_state(agent_cls, agent_config, env, cfg.seed)
        rollout_length = template.agent.rollout_length(n)
        iteration = partial(_on_policy_iteration, env=env, rollout_length=rollout_length)
        steps_per_iter = rollout_length * n
    else:
        num_updates = cfg.updates_per_step or agent_config.utd_ratio * n
        iteration = partial(_off_policy_iteration, env=env, num_updates=num_updates)
        steps_per_iter = n
    # Chunks end at every log, eval and checkpoint point (the host acts only between chunks).
    every = min(cfg.log_every, cfg.eval_every, cfg.checkpoint_every or cfg.eval_every)
    iters_per_chunk = max(1, every // steps_per_iter)
    states = jax.jit(jax.vmap(lambda s: init_fused_state(agent_cls, agent_config, env, s)))(seeds)
    states = strongly_typed(states)
    loggers = [RunLogger(o, cfg.tensorboard, cfg.wandb_project, os.path.basename(o)) for o in outs]
    ckpts = [Checkpointer(os.path.join(o, "checkpoints")) for o in outs]
    step = 0
    last_eval = np.full((num_seeds, 2), np.nan)

    latest = [c.latest_step() for c in ckpts]
    if any(s is not None for s in latest):
        if len(set(latest)) != 1:
            raise ValueError(
                f"The seed run directories hold checkpoints of different steps ({latest}); "
                "resume each seed on its own (jaxrl train ... --seed S --out DIR) or start anew."
            )
        template = jax.tree.map(lambda x: x[0], states)
        restored, metas = zip(*(c.restore(template) for c in ckpts), strict=True)
        states = jax.tree.map(lambda *xs: jnp.stack(xs), *restored)
        step = int(metas[0]["step"])
        last_eval = np.array([m.get("last_eval", [np.nan, np.nan]) for m in metas], float)
        print(f"Resuming {', '.join(outs)} from step {step}.")
    for logger in loggers:
        logger.truncate(step)
    done_already = _completed_summaries(outs, step, cfg.total_steps)
    if done_already is not None:
        for logger in loggers:
            logger.close()
        return done_already

    def save() -> None:
        for i, ckpt in enumerate(ckpts):
            meta = {"step": step, "last_eval": last_eval[i].tolist()}
            ckpt.save(step, jax.tree.map(lambda x, i=i: x[i], states), meta)

    chunk_fns: dict[int, Any] = {}

    def run_chunk(states: FusedState, num_iters: int) -> tuple[FusedState, Any]:
        if num_iters not in chunk_fns:
            fn = partial(
                _chunk, iteration=iteration, num_iters=num_iters, steps_per_iter=steps_per_iter
            )
            chunk_fns[num_iters] = jax.jit(fn, donate_argnums=0)
        return chunk_fns[num_iters](states, jnp.int32(step))

    eval_fn = jax.jit(
        jax.vmap(lambda a, k, s: evaluate_jax(a, eval_env, k, s), in_axes=(0, None, 0))
    )
    eval_key = jax.random.key(cfg.seed + 10_000)
    ckpt_every = cfg.checkpoint_every or cfg.eval_every
    start_step, start_time, updates = step, time.perf_counter(), 0
    last_log = (step, start_time)
    bar = _progress_bar(cfg, step)
    with _StopFlag() as stop:
        while step < cfg.total_steps and not stop.raised:
            iters = min(iters_per_chunk, -(-(cfg.total_steps - step) // steps_per_iter))
            states, metrics = run_chunk(states, iters)
            prev, step = step, step + iters * steps_per_iter
            updates += iters * (1 if on_policy else num_updates)
            if bar is not None:
                bar.update(step - prev)
            at_eval = step // cfg.eval_every > prev // cfg.eval_every or step >= cfg.total_steps
            metrics = jax.device_get(metrics)
            # Off-policy agents report zeros before learning_starts: do not log those as losses.
            learned = on_policy or step - steps_per_iter >= agent_config.learning_starts
            now = time.perf_counter()
            rate = (step - last_log[0]) / max(now - last_log[1], 1e-9)
            if at_eval:
                returns = np.asarray(eval_fn(states.agent, eval_key, _obs_stats(states.env)))
                last_eval = np.stack([returns.mean(1), returns.std(1)], 1)
            for i, logger in enumerate(loggers):
                row = {
                    k: float(v[i])
                    for k, v in metrics.items()
                    if learned and not k.startswith("train/episode")
                }
                if metrics["train/episodes"][i] > 0:
                    row["train/episode_return"] = float(
                        metrics["train/episode_return_sum"][i] / metrics["train/episodes"][i]
                    )
                row["time/env_steps_per_s"] = rate
                if at_eval:
                    row["eval_return"], row["eval_return_std"] = map(float, last_eval[i])
                logger.log(step, row)
            last_log = (step, time.perf_counter())
            if bar is not None:
                bar.set_postfix(sps=f"{rate:.0f}", eval=f"{np.mean(last_eval[:, 0]):.1f}")
            if step // ckpt_every > prev // ckpt_every or step >= cfg.total_steps:
                save()
        if stop.raised:
            save()
    wall = time.perf_counter() - start_time
    titles = [f"{agent_name} on {cfg.env} (seed {cfg.seed + i})" for i in range(num_seeds)]
    _close_run(bar, dict(zip(titles, loggers, strict=True)), step, cfg.total_steps)
    summaries = []
    for i, out in enumerate(outs):
        summary = _summary(
            agent_name, cfg, cfg.seed + i, step, tuple(last_eval[i]), wall, start_step, updates
        )
        write_json(os.path.join(out, "summary.json"), summary)
        summaries.append(summary)
    return summaries



# ---------------------------------------------------------------------------------- offline loop


def strongly_typed(tree: Any) -> Any:
    """``tree`` with every leaf a strongly typed array.

    Weakly typed leaves (Python scalars, flax's ``TrainState.step``) come back strongly typed from
    a jitted chunk, which would recompile the chunk once; restoring into weak types would differ
    from what was saved.
    """
    return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.asarray(x).dtype), tree)


class OfflineState(struct.PyTreeNode):
    """What the offline loop carries and checkpoints: the agent and the minibatch RNG.

    The dataset is not part of it (it is read again from ``--dataset`` on resume).
    """

    agent: Any
    rng: jax.Array


def _offline_chunk(
    state: OfflineState, data: BufferState, *, num_updates: int, batch_size: int
) -> tuple[OfflineState, dict[str, jax.Array]]:
    """``num_updates`` gradient steps on uniform minibatches of ``data`` under ``lax.scan``."""
    rng, key = jax.random.split(state.rng)

    def body(agent: Any, k: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        return agent.update(buffer_sample(data, k, batch_size))

    agent, infos = jax.lax.scan(body, state.agent, jax.random.split(key, num_updates))
    return OfflineState(agent, rng), jax.tree.map(lambda x: x[-1], infos)


def _evaluator(eval_env: Any, seed: int) -> Any:
    """``agent -> [episodes] returns`` for a host env or a JAX env."""
    if isinstance(eval_env, HostEnv):
        act_fn = jax.jit(lambda a, o: a.eval_actions(o))
        return lambda agent: evaluate(agent, eval_env, seed, act_fn)
    fn = jax.jit(lambda a: evaluate_jax(a, eval_env, jax.random.key(seed)))
    return lambda agent: np.asarray(fn(agent))


def train_offline(
    agent: Any,
    data: BufferState,
    eval_env: Any,
    cfg: TrainConfig,
    out: str,
    agent_name: str = "agent",
    score_fn: Any = None,
) -> dict[str, Any]:
    """Train ``agent`` on a fixed dataset for ``cfg.total_steps`` gradient steps.

    Updates run in chunks of ``lax.scan`` on the device-resident ``data``; between chunks the host
    logs, evaluates the deterministic policy in ``eval_env`` (Gymnasium or JAX), and checkpoints
    (agent and RNG, not the dataset). Resumes from ``out/checkpoints``.

    Args:
        agent: a freshly created agent, its ``norm`` already set from the dataset.
        data: the dataset as a full buffer state (``Dataset.buffer``).
        eval_env: evaluation env (``cfg.eval_episodes`` copies).
        cfg: loop options; ``total_steps``, ``eval_every``, ``log_every`` count gradient steps.
        out: run directory (``prepare_run_dir`` first).
        agent_name: name recorded in summary.json.
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).

    Returns:
        The summary written to ``out/summary.json``.
    """
    score_fn = score_fn or (lambda _: None)
    state = OfflineState(agent, jax.random.key(cfg.seed + 1))
    state = strongly_typed(state)
    logger = RunLogger(out, cfg.tensorboard, cfg.wandb_project, os.path.basename(out))
    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    step, last_eval = 0, (float("nan"), float("nan"))
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        step, last_eval = int(meta["step"]), tuple(meta.get("last_eval", last_eval))
        print(f"Resuming {out} from step {step}.")
    logger.truncate(step)
    done_already = _completed_summaries([out], step, cfg.total_steps)
    if done_already is not None:
        logger.close()
        return done_already[0]

    batch_size = agent.config.batch_size
    chunk_fns: dict[int, Any] = {}

    def run_chunk(state: OfflineState, n: int) -> tuple[OfflineState, Any]:
        if n not in chunk_fns:
            fn = partial(_offline_chunk, num_updates=n, batch_size=batch_size)
            chunk_fns[n] = jax.jit(fn, donate_argnums=0)
        return chunk_fns[n](state, data)

    evaluate_fn = _evaluator(eval_env, cfg.seed + 10_000)
    ckpt_every = cfg.checkpoint_every or cfg.eval_every
    periods = (cfg.log_every, cfg.eval_every, ckpt_every)
    start_step, start_time = step, time.perf_counter()
    last_log = (step, start_time)
    bar = _progress_bar(cfg, step)
    meta = {"step": step, "last_eval": list(last_eval), "phase": "offline"}
    with _StopFlag() as stop:
        while step < cfg.total_steps and not stop.raised:
            # A chunk ends at the next log, eval or checkpoint point, whichever comes first.
            n = min(*(p - step % p for p in periods), cfg.total_steps - step)
            state, info = run_chunk(state, n)
            prev, step = step, step + n
            info = jax.device_get(info)  # waits for the chunk: the rate below is compute time
            if bar is not None:
                bar.update(n)
            now = time.perf_counter()
            row = {k: float(v) for k, v in info.items()}
            row["time/updates_per_s"] = (step - last_log[0]) / max(now - last_log[1], 1e-9)
            if step // cfg.eval_every > prev // cfg.eval_every or step >= cfg.total_steps:
                returns = evaluate_fn(state.agent)
                last_eval = (float(returns.mean()), float(returns.std()))
                row["eval_return"], row["eval_return_std"] = last_eval
                score = score_fn(last_eval[0])
                if score is not None:
                    row["eval_normalized_score"] = score
            if step // cfg.log_every > prev // cfg.log_every or "eval_return" in row:
                logger.log(step, row)
            last_log = (step, time.perf_counter())
            if bar is not None:
                bar.set_postfix(ups=f"{row['time/updates_per_s']:.0f}", eval=f"{last_eval[0]:.1f}")
            meta = {"step": step, "last_eval": list(last_eval), "phase": "offline"}
            if step // ckpt_every > prev // ckpt_every or step >= cfg.total_steps:
                ckpt.save(step, state, meta)
        if stop.raised:
            ckpt.save(step, state, meta)
    wall = time.perf_counter() - start_time
    _close_run(bar, {f"{agent_name} on {cfg.dataset or cfg.env}": logger}, step, cfg.total_steps)
    updates = step - start_step
    summary = _summary(agent_name, cfg, cfg.seed, step, last_eval, wall, start_step, updates)
    summary["env_steps_per_s"] = 0.0
    summary["dataset"] = cfg.dataset
    if summary["completed"]:
        summary["normalized_score"] = score_fn(last_eval[0])
    write_json(os.path.join(out, "summary.json"), summary)
    return summary

__all__ = [
    "FusedState",
    "LoopState",
    "OfflineState",
    "TrainConfig",
    "evaluate",
    "evaluate_jax",
    "init_fused_state",
    "init_loop_state",
    "default_out",
    "prepare_run_dir",
    "run_config",
    "train_fused",
    "train_host",
    "train_offline",
]
