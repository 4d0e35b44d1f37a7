"""Generate D4RL-style datasets locally: random, medium, expert, medium-replay, medium-expert.

The D4RL recipe (Fu et al., 2020, sec. 5): *random* rolls out a uniform random policy; *medium* a
policy trained to roughly a third of expert return; *expert* a fully trained policy; both act
stochastically. *medium-replay* is the replay buffer of the medium policy's training run (every
transition it saw up to that point); *medium-expert* concatenates medium and expert data. Here the
policies are jaxrl run directories (``jaxrl train sac --env Hopper-v5 --out runs/sac_hopper``):
the newest checkpoint, or ``policy_step``. Everything is seeded, so a collection is reproducible.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.data.dataset import Dataset, DatasetError
from jaxrl.data.scores import reference_returns
from jaxrl.envs import make_env
from jaxrl.envs.jax_envs import is_jax_env, make_jax_env
from jaxrl.loops.acting import POLICY, Acting
from jaxrl.loops.evaluation import evaluate, evaluate_jax
from jaxrl.normalization import normalize
from jaxrl.run.runs import load_run

KINDS = ("random", "medium", "expert", "medium-replay", "medium-expert")


def _policy(run_dir: str, step: int | None) -> Any:
    try:
        return load_run(run_dir, step)
    except (ValueError, FileNotFoundError) as err:
        raise DatasetError(f"Cannot load the policy {run_dir!r}: {err}") from None


def rollout(
    env_id: str, agent: Any | None, steps: int, seed: int, obs_stats: Any = None
) -> Dataset:
    """``steps`` transitions of one env; ``agent=None`` acts uniformly at random.

    Actions are the agent's stochastic ``sample_actions`` (D4RL collected with the stochastic
    policy), stored in the environment's units. The last row is marked as a timeout unless its
    episode terminated, so no episode runs past the end of the data. On a JAX env the rollout is
    one compiled scan (``rollout_jax``).
    """
    if is_jax_env(env_id):
        return rollout_jax(env_id, agent, steps, seed, obs_stats)
    with closing(make_env(env_id, 1)) as env:
        low, high = env.action_low, env.action_high
        rng = np.random.default_rng(seed)
        if agent is not None:
            key = jax.random.key(seed)
            act = jax.jit(lambda a, o, t: a.sample_actions(o, jax.random.fold_in(key, t)))
        cols: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next", "term", "trunc")}
        obs = env.reset(seed=seed)
        for t in range(steps):
            if agent is None:
                action = rng.uniform(-1.0, 1.0, (1, env.action_dim)).astype(np.float32)
            else:
                action = np.asarray(act(agent, jnp.asarray(obs), t))
            next_obs, new_obs, reward, terminated, truncated = env.step(action)
            action = np.clip(action, -1.0, 1.0)
            native = low + (action + 1.0) * 0.5 * (high - low)
            row = (obs, native, reward, next_obs, terminated, truncated)
            for k, v in zip(cols, row, strict=True):
                cols[k].append(v[0])
            obs = new_obs
    truncs = np.array(cols["trunc"])
    terms = np.array(cols["term"])
    truncs[-1] = truncs[-1] or not terms[-1]
    return Dataset(
        observations=np.array(cols["obs"]),
        actions=np.array(cols["act"]),
        rewards=np.array(cols["rew"]),
        next_observations=np.array(cols["next"]),
        terminals=terms,
        timeouts=truncs,
        env_id=env_id,
    )


def rollout_jax(
    env_id: str, agent: Any | None, steps: int, seed: int, obs_stats: Any = None
) -> Dataset:
    """``rollout`` on a JAX env: ``steps`` transitions of one copy, as one ``lax.scan``.

    The dataset holds the env's raw observations and its actions (``[-1, 1]``, the JAX envs'
    units); a policy trained with normalized observations (``obs_stats``, PPO's wrapper) sees
    them normalized with its training statistics, as in its evaluation.
    """
    env = make_jax_env(env_id, 1)
    k_reset, k_act = jax.random.split(jax.random.key(seed))

    def step(state: Any, t: jax.Array) -> tuple[Any, tuple[jax.Array, ...]]:
        key = jax.random.fold_in(k_act, t)
        if agent is None:
            action = jax.random.uniform(key, (1, env.action_size), minval=-1.0, maxval=1.0)
        else:
            seen = state.obs if obs_stats is None else normalize(obs_stats, state.obs)
            action = jnp.clip(agent.sample_actions(seen, key), -1.0, 1.0)
        new = env.step(state, action)
        row = (state.obs, action, new.reward, new.info["final_obs"], new.terminated)
        return new, (*(x[0] for x in row), new.truncation[0])

    run = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(steps))[1])
    obs, act, rew, nxt, term, trunc = jax.tree.map(np.asarray, run(env.reset(k_reset)))
    terms, truncs = term > 0.5, trunc > 0.5
    truncs[-1] = truncs[-1] or not terms[-1]
    return Dataset(obs, act, rew, nxt, terms, truncs, env_id=env_id)


def _action_bounds(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The env's action bounds (a JAX env's are ``[-1, 1]``)."""
    if is_jax_env(env_id):
        size = make_jax_env(env_id, 1).action_size
        return -np.ones(size, np.float32), np.ones(size, np.float32)
    with closing(make_env(env_id, 1)) as env:
        return env.action_low, env.action_high


def replay_buffer_dataset(run: Any, env_id: str, steps: int | None = None) -> Dataset:
    """The replay buffer of a training run as a dataset, oldest transitions first.

    The loops add ``num_envs`` rows per step, so the buffer interleaves envs; rows are regrouped
    per env so that episodes are contiguous. Time-limit ends (not stored in the buffer) are found
    where a transition's next observation is not the following observation.
    """
    buf = getattr(run.state, "buffer", None)
    if buf is None:
        raise DatasetError(f"{run.run_dir} has no replay buffer (on-policy or offline run).")
    data = jax.tree.map(np.asarray, buf.data)
    size, pos, cap = int(buf.size), int(buf.pos), buf.capacity
    order = np.arange(size) if size < cap else (np.arange(cap) + pos) % cap
    n = int(run.train_config.num_envs or (64 if is_jax_env(run.config["env"]) else 1))
    order = order[: len(order) // n * n]
    streams = order.reshape(-1, n).T  # [n, steps]: row indices of each env, oldest first
    low, high = _action_bounds(env_id)
    parts = []
    for rows in streams:
        obs, nxt = data.obs[rows], data.next_obs[rows]
        term = data.terminal[rows] > 0.5
        cut = np.zeros(len(rows), bool)
        cut[:-1] = ~term[:-1] & np.any(nxt[:-1] != obs[1:], axis=-1)
        cut[-1] = not term[-1]
        parts.append(
            Dataset(
                obs,
                low + (np.clip(data.action[rows], -1, 1) + 1.0) * 0.5 * (high - low),
                data.reward[rows],
                nxt,
                term,
                cut,
                env_id=env_id,
            )
        )
    ds = Dataset.concatenate(parts) if len(parts) > 1 else parts[0]
    if steps is not None and steps < len(ds):
        ds = _head(ds, steps)
    return ds


def _head(ds: Dataset, n: int) -> Dataset:
    timeouts = ds.timeouts[:n].copy()
    timeouts[-1] = timeouts[-1] or not ds.terminals[n - 1]
    return Dataset(
        ds.observations[:n],
        ds.actions[:n],
        ds.rewards[:n],
        ds.next_observations[:n],
        ds.terminals[:n],
        timeouts,
        env_id=ds.env_id,
    )


def policy_return(
    env_id: str, agent: Any | None, episodes: int, seed: int, obs_stats: Any = None
) -> float:
    """Mean return of the deterministic policy, or of uniform random actions (``agent=None``).

    ``obs_stats``: a JAX-env policy's training observation statistics (frozen), if it has any.
    """
    if is_jax_env(env_id):
        env = make_jax_env(env_id, episodes, normalize_obs=obs_stats is not None)
        env.update = False
        policy = POLICY
        if agent is None:
            shape = (episodes, env.action_size)
            uniform = lambda key: jax.random.uniform(key, shape, minval=-1.0, maxval=1.0)  # noqa: E731
            act = lambda a, c, o, f, k: (uniform(k), c)  # noqa: E731
            policy = Acting(POLICY.init, act, act)
        run = jax.jit(lambda a, s: evaluate_jax(a, env, jax.random.key(seed), s, policy))
        return float(np.mean(np.asarray(run(agent, obs_stats))))
    with closing(make_env(env_id, episodes)) as env:
        act_fn = None
        if agent is None:
            rng = np.random.default_rng(seed)
            act_fn = lambda _, obs: rng.uniform(-1.0, 1.0, (len(obs), env.action_dim))  # noqa: E731
        return float(np.mean(evaluate(agent, env, seed, act_fn)))


def collect(
    env_id: str | None,
    kind: str,
    steps: int,
    seed: int = 0,
    policy: str | None = None,
    policy_step: int | None = None,
    medium_policy: str | None = None,
    expert_policy: str | None = None,
    ref_min_return: float | None = None,
    ref_max_return: float | None = None,
    ref_episodes: int = 50,
) -> Dataset:
    """Generate a dataset of ``kind`` (see the module docstring) and its reference returns.

    Args:
        env_id: Gymnasium env to collect on; default: the policy run's env.
        kind: one of ``KINDS``.
        steps: transitions to collect (per part for medium-expert; the first ``steps`` buffer rows
            for medium-replay).
        seed: seeds the env resets and the action noise.
        policy: run directory of the behavior policy (the expert for medium-expert).
        policy_step: checkpoint step of ``policy`` (default: newest).
        medium_policy: run directory of the medium policy (medium-expert only).
        expert_policy: run directory whose return sets the reference maximum when the env has no
            D4RL constants and the kind is not expert / medium-expert.
        ref_min_return: explicit reference minimum (random) return; overrides everything.
        ref_max_return: explicit reference maximum (expert) return; overrides everything.
        ref_episodes: episodes used to measure reference returns.

    Returns:
        The dataset, with ``ref_returns`` and collection ``metadata`` set (save it with
        ``save_d4rl``).
    """
    if kind not in KINDS:
        raise DatasetError(f"Unknown dataset kind {kind!r}; choose one of {', '.join(KINDS)}.")
    if steps <= 0:
        raise DatasetError(f"--steps must be positive, got {steps}.")
    if kind != "random" and policy is None:
        raise DatasetError(f"--kind {kind} needs --policy RUN_DIR (a trained jaxrl run).")
    if kind == "medium-expert" and medium_policy is None:
        raise DatasetError("--kind medium-expert needs --medium-policy RUN_DIR besides --policy.")
    run = _policy(policy, policy_step) if policy else None
    if env_id is None:
        if run is None:
            raise DatasetError("--kind random needs --env.")
        env_id = run.config["env"]
    agent = None if run is None else run.agent
    stats = None if run is None else run.obs_stats

    if kind == "random":
        ds = rollout(env_id, None, steps, seed)
    elif kind in ("medium", "expert"):
        ds = rollout(env_id, agent, steps, seed, stats)
    elif kind == "medium-replay":
        ds = replay_buffer_dataset(run, env_id, steps)
    else:
        medium = _policy(medium_policy, None)
        ds = Dataset.concatenate(
            [
                rollout(env_id, medium.agent, steps, seed, medium.obs_stats),
                rollout(env_id, agent, steps, seed + 1, stats),
            ]
        )

    d4rl = reference_returns(env_id)
    sources = {}
    if ref_min_return is None:
        if d4rl is not None:
            ref_min_return, sources["min"] = d4rl[0], "D4RL constant"
        else:
            ref_min_return = policy_return(env_id, None, ref_episodes, seed + 1000)
            sources["min"] = f"uniform random policy, {ref_episodes} episodes"
    if ref_max_return is None:
        expert_dir = policy if kind in ("expert", "medium-expert") else expert_policy
        if d4rl is not None:
            ref_max_return, sources["max"] = d4rl[1], "D4RL constant"
        elif expert_dir is not None:
            expert = run if expert_dir == policy else _policy(expert_dir, None)
            ref_max_return = policy_return(
                env_id, expert.agent, ref_episodes, seed + 1000, expert.obs_stats
            )
            sources["max"] = f"deterministic return of {expert_dir}, {ref_episodes} episodes"
        else:
            raise DatasetError(
                f"{env_id} has no D4RL reference returns: pass --expert-policy RUN_DIR (its "
                "return becomes the reference maximum) or --ref-max-return R."
            )
    returns = ds.episode_returns()
    ds.ref_returns = (float(ref_min_return), float(ref_max_return))
    ds.metadata = {
        "env_id": env_id,
        "kind": kind,
        "algorithm": run.config["agent"] if run else "random",
        "policy": policy or "",
        "policy_step": int(run.meta["step"]) if run else -1,
        "medium_policy": medium_policy or "",
        "steps": int(steps),  # as asked (per part for medium-expert; a cap for medium-replay)
        "transitions": len(ds),
        "seed": int(seed),
        "behavior_return_mean": float(returns.mean()),
        "ref_min_source": sources.get("min", "given"),
        "ref_max_source": sources.get("max", "given"),
        "collected_by": "jaxrl dataset collect",
    }
    ds.source = f"collect:{kind}"
    return ds
