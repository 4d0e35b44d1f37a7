"""Deterministic-policy evaluation on host (Gymnasium) and JAX envs.

Kept apart from the training loops so that dataset collection, ``jaxrl eval`` and export can
evaluate a policy without loading the loops.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.gym import HostEnv
from jaxrl.loops.acting import POLICY, Acting


@jax.jit
def eval_act(agent: Any, obs: jax.Array) -> jax.Array:
    """``agent.eval_actions(obs)``, compiled once per agent structure and batch shape."""
    return agent.eval_actions(obs)


@partial(jax.jit, static_argnames="exploit")
def _exploit(
    agent: Any, carry: Any, obs: jax.Array, first: jax.Array, key: jax.Array, exploit: Any
) -> tuple[jax.Array, Any]:
    return exploit(agent, carry, obs, first, key)


def evaluate(
    agent: Any,
    env: HostEnv,
    seed: int,
    act_fn: Any = None,
    policy: Acting = POLICY,
    frames: list | None = None,
) -> np.ndarray:
    """Run one deterministic episode in each copy of ``env``; returns the ``[num_envs]`` returns.

    Every copy is reset with a fixed seed, so an evaluation depends only on the agent's parameters.
    ``act_fn(agent, obs)`` defaults to ``eval_act``: one compiled call per step, and no new
    compilation on later evaluations of an agent of the same structure. A planner (``policy``
    with a carry, see ``jaxrl.loops.acting``) plans at every step, its sampling keyed by ``seed``.
    ``frames`` (a list) receives copy 0's frame before each of its steps (``env`` built with
    ``make_env(..., render=...)``).
    """
    if policy is not POLICY:
        key = jax.random.key(seed)
        carry, first = policy.init(agent, env.num_envs), np.ones(env.num_envs, bool)

        def act_fn(agent: Any, obs: np.ndarray) -> jax.Array:
            nonlocal carry, first, key
            key, k = jax.random.split(key)
            action, carry = _exploit(agent, carry, obs, first, k, policy.exploit)
            return action

    act_fn = act_fn or eval_act
    obs = env.reset(seed=seed)
    returns = np.zeros(env.num_envs)
    running = np.ones(env.num_envs, bool)
    while running.any():
        if frames is not None and running[0]:
            frames.append(env.render())
        action = np.asarray(act_fn(agent, obs))
        _, obs, reward, terminated, truncated = env.step(action)
        first = terminated | truncated
        returns += reward * running
        running &= ~(terminated | truncated)
    return returns


def _rollout(
    agent: Any, env: Any, key: jax.Array, obs_stats: Any, policy: Acting, keep: Any
) -> tuple[jax.Array, Any]:
    """The first episode of each copy: returns ``[num_envs]`` and ``keep(state)`` per step."""
    plan_key = jax.random.fold_in(key, 1)
    state = env.reset(key)
    if obs_stats is not None:
        state = env.with_stats(state, obs_stats)

    def body(carry: tuple[Any, ...], t: jax.Array) -> tuple[Any, Any]:
        state, plan, ret, alive = carry
        first = state.time == 0
        k = jax.random.fold_in(plan_key, t)
        kept = keep(state, alive)
        action, plan = policy.exploit(agent, plan, state.obs, first, k)
        state = env.step(state, action)
        ret = ret + state.reward * alive
        alive = alive * (1.0 - jnp.maximum(state.terminated, state.truncation))
        return (state, plan, ret, alive), kept

    ones = jnp.ones(env.num_envs, jnp.float32)
    init = (state, policy.init(agent, env.num_envs), 0.0 * ones, ones)
    (_, _, ret, _), kept = jax.lax.scan(body, init, jnp.arange(env.episode_length))
    return ret, kept


def evaluate_jax(
    agent: Any, env: Any, key: jax.Array, obs_stats: Any = None, policy: Acting = POLICY
) -> jax.Array:
    """Return of the first episode of each copy of ``env`` under the deterministic policy.

    ``env`` runs ``env.episode_length`` steps (one episode at most per copy; later ones are
    ignored). With a frozen ``NormalizeObservation`` wrapper, pass the training ``obs_stats``.
    A planner (``policy``) carries its plan through the episode. Pure: jit it, or vmap it over
    seeds.
    """
    return _rollout(agent, env, key, obs_stats, policy, lambda state, alive: None)[0]


def record_jax(
    agent: Any, env: Any, key: jax.Array, obs_stats: Any = None, policy: Acting = POLICY
) -> tuple[jax.Array, Any, jax.Array]:
    """``evaluate_jax``, also keeping what frames of each copy's first episode need.

    Returns:
        ``(returns [num_envs], data, alive)``: ``data`` is ``render_data`` of every copy at
        every step (leading ``[episode_length, num_envs]``), ``alive`` ``[episode_length,
        num_envs]`` is 1 for the steps inside the first episode. Pure: jit it; pull the result
        to the host once.
    """
    from jaxrl.envs.render import render_data

    core = env.core

    def keep(state: Any, alive: jax.Array) -> tuple[Any, jax.Array]:
        return jax.vmap(lambda sim: render_data(core, sim))(state.sim), alive

    ret, (data, alive) = _rollout(agent, env, key, obs_stats, policy, keep)
    return ret, data, alive


def evaluator(eval_env: Any, seed: int, policy: Acting = POLICY) -> Any:
    """``(agent, seed=seed) -> [episodes] returns`` (numpy) for a host env or a JAX env.

    The seed may be given per call (a sweep's members): a JAX env's evaluation compiles once.
    """
    if isinstance(eval_env, HostEnv):
        return lambda agent, seed=seed: evaluate(agent, eval_env, seed, policy=policy)
    fn = jax.jit(lambda a, k: evaluate_jax(a, eval_env, k, policy=policy))
    return lambda agent, seed=seed: np.asarray(fn(agent, jax.random.key(seed)))


def close_envs(*envs: Any) -> None:
    """Close the host envs among ``envs`` (JAX envs hold no resources)."""
    for env in envs:
        if isinstance(env, HostEnv):
            env.close()


__all__ = ["close_envs", "eval_act", "evaluate", "evaluate_jax", "evaluator", "record_jax"]
