"""Deterministic-policy evaluation on host (Gymnasium) and JAX envs.

Kept apart from the training loops so that dataset collection, ``jaxrl eval`` and export can
evaluate a policy without loading the loops.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.gym import HostEnv


@jax.jit
def eval_act(agent: Any, obs: jax.Array) -> jax.Array:
    """``agent.eval_actions(obs)``, compiled once per agent structure and batch shape."""
    return agent.eval_actions(obs)


def evaluate(agent: Any, env: HostEnv, seed: int, act_fn: Any = None) -> np.ndarray:
    """Run one deterministic episode in each copy of ``env``; returns the ``[num_envs]`` returns.

    Every copy is reset with a fixed seed, so an evaluation depends only on the agent's parameters.
    ``act_fn(agent, obs)`` defaults to ``eval_act``: one compiled call per step, and no new
    compilation on later evaluations of an agent of the same structure.
    """
    act_fn = act_fn or eval_act
    obs = env.reset(seed=seed)
    returns = np.zeros(env.num_envs)
    running = np.ones(env.num_envs, bool)
    while running.any():
        action = np.asarray(act_fn(agent, obs))
        _, obs, reward, terminated, truncated = env.step(action)
        returns += reward * running
        running &= ~(terminated | truncated)
    return returns


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
        alive = alive * (1.0 - jnp.maximum(state.terminated, state.truncation))
        return (state, ret, alive), None

    ones = jnp.ones(env.num_envs, jnp.float32)
    (_, ret, _), _ = jax.lax.scan(body, (state, 0.0 * ones, ones), None, length=env.episode_length)
    return ret


def evaluator(eval_env: Any, seed: int) -> Any:
    """``agent -> [episodes] returns`` (numpy) for a host env or a JAX env."""
    if isinstance(eval_env, HostEnv):
        return lambda agent: evaluate(agent, eval_env, seed)
    fn = jax.jit(lambda a: evaluate_jax(a, eval_env, jax.random.key(seed)))
    return lambda agent: np.asarray(fn(agent))


def close_envs(*envs: Any) -> None:
    """Close the host envs among ``envs`` (JAX envs hold no resources)."""
    for env in envs:
        if isinstance(env, HostEnv):
            env.close()


__all__ = ["close_envs", "eval_act", "evaluate", "evaluate_jax", "evaluator"]
