"""Random pushes for Brax envs: velocity kicks of random direction and speed on the root.

Kept apart from ``jaxrl.envs.sim2real`` because it reaches into the simulator state through
the core's ``kick`` (``BraxCore``), where the other wrappers only see observations and actions.
``push_schedule`` validates the pushes of both this wrapper and the Gymnasium one
(``jaxrl.envs.gym_sim2real.Pushes``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.envs.ids import steps_range
from jaxrl.envs.state import EnvState, episode_ended, where_per_env
from jaxrl.envs.wrappers import Wrapper


def push_schedule(
    speed: tuple[float, float], interval: tuple[int, int], duration: int
) -> tuple[tuple[float, float], tuple[int, int], int]:
    """Validated ``(speed, interval, duration)`` of random pushes (Brax and Gymnasium ``Pushes``).

    Raises:
        ValueError: an interval below 1 step, a duration below 1, or a bad speed range.
    """
    steps = steps_range(tuple(interval), "Pushes interval")
    if steps[0] < 1 or duration < 1 or not 0 <= speed[0] <= speed[1]:
        raise ValueError(
            f"Pushes: need interval >= 1 step, duration >= 1 and 0 <= speed low <= high; "
            f"got interval={interval}, duration={duration}, speed={speed}."
        )
    return (float(speed[0]), float(speed[1])), steps, int(duration)


class Pushes(Wrapper):
    """Random pushes: velocity kicks of a random direction and speed at random intervals.

    Every ``interval`` steps (drawn per push from ``(low, high)``), each env draws a direction
    in the ground plane and a speed from ``speed`` (m/s) and adds it to its root's velocity,
    spread over ``duration`` steps (the core's ``kick``: Brax envs). The countdown restarts at
    every episode start. Wrap the bare env (``VecEnv``) or keep only per-env wrappers between.

    Args:
        env: the env to wrap (its ``core`` must have ``kick(sim, dv)``, e.g. ``BraxCore``).
        speed: ``(low, high)`` of the kick's speed in m/s.
        interval: ``(low, high)`` steps between pushes, inclusive.
        duration: steps a push lasts, >= 1.
    """

    def __init__(
        self,
        env: Any,
        speed: tuple[float, float] = (0.1, 1.0),
        interval: tuple[int, int] = (100, 200),
        duration: int = 1,
    ):
        super().__init__(env)
        self.speed, self.interval, self.duration = push_schedule(speed, interval, duration)

    def _countdown(self, key: jax.Array) -> jax.Array:
        low, high = self.interval
        return jax.random.randint(key, (self.num_envs,), low, high + 1)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset with every env's first push scheduled."""
        state = self.env.reset(key)
        k_count, k_next = jax.random.split(jax.random.fold_in(key, 15_485_863))
        push = {
            "countdown": self._countdown(k_count),
            "remaining": jnp.zeros(self.num_envs, jnp.int32),
            "dv": jnp.zeros((self.num_envs, 2), jnp.float32),
            "key": k_next,
        }
        return state.replace(extras={**state.extras, "push": push})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Start due pushes, apply the active ones to the simulator, then step."""
        p = state.extras["push"]
        key, k_angle, k_speed, k_count = jax.random.split(p["key"], 4)
        due = p["countdown"] <= 0
        angle = jax.random.uniform(k_angle, (self.num_envs,), maxval=2 * jnp.pi)
        speed = jax.random.uniform(k_speed, (self.num_envs,), minval=self.speed[0],
                                   maxval=self.speed[1])  # fmt: skip
        new_dv = speed[:, None] * jnp.stack([jnp.cos(angle), jnp.sin(angle)], 1)
        dv = where_per_env(due, new_dv, p["dv"])
        remaining = jnp.where(due, self.duration, p["remaining"])
        countdown = jnp.where(due, self._countdown(k_count), p["countdown"])
        active = remaining > 0
        per_step = jnp.where(active[:, None], dv / self.duration, 0.0)
        sim = jax.vmap(self.core.kick)(state.sim, per_step)
        state = self.env.step(state.replace(sim=sim), action)
        ended = episode_ended(state)
        push = {
            "countdown": jnp.where(ended, self._countdown(k_count), countdown - 1),
            "remaining": jnp.where(ended, 0, remaining - active),
            "dv": dv,
            "key": key,
        }
        return state.replace(extras={**state.extras, "push": push})


__all__ = ["Pushes", "push_schedule"]
