"""Gymnasium equivalents of the sim-to-real wrappers (``jaxrl.envs.sim2real``) for host envs.

Same semantics as the JAX versions, on one ``gymnasium.Env``: wrap each env before it is
vectorized (``gymnasium.vector.SyncVectorEnv([lambda: ActionDelay(gym.make(id), 2)])``).
Per-episode state restarts in ``reset``; the RNG is the env's ``np_random``, so ``reset(seed=)``
makes the noise and the drawn delays reproducible.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from jaxrl.envs.sim2real import steps_range


class ObservationNoise(gym.ObservationWrapper):
    """Gaussian noise of standard deviation ``scale`` (scalar or per channel) on observations."""

    def __init__(self, env: gym.Env, scale: Any):
        super().__init__(env)
        size = int(np.prod(env.observation_space.shape))
        self.scale = np.broadcast_to(np.asarray(scale, np.float64), (size,)).copy()
        if np.any(self.scale < 0) or not np.all(np.isfinite(self.scale)):
            raise ValueError(f"ObservationNoise: scale must be finite and >= 0, got {scale}.")

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The observation plus fresh noise."""
        noise = self.np_random.normal(size=observation.shape) * self.scale.reshape(
            observation.shape
        )
        return (observation + noise).astype(observation.dtype)


class ActionDelay(gym.Wrapper):
    """Apply each action ``k`` steps after it was chosen (zeros before).

    ``steps`` is ``k`` or ``(low, high)``, from which each episode draws its delay.
    """

    def __init__(self, env: gym.Env, steps: int | tuple[int, int]):
        super().__init__(env)
        self.low, self.high = steps_range(steps, "ActionDelay")
        self.delay, self.queue = self.low, deque()

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset, empty the queue and draw the episode's delay."""
        out = self.env.reset(**kwargs)
        self.delay = int(self.np_random.integers(self.low, self.high + 1))
        zero = np.zeros(self.action_space.shape, self.action_space.dtype)
        self.queue = deque([zero] * self.delay)
        return out

    def step(self, action: Any) -> tuple:
        """Queue ``action`` and step with the one chosen ``k`` steps ago."""
        self.queue.append(np.asarray(action))
        return self.env.step(self.queue.popleft())


class ObservationDelay(gym.Wrapper):
    """Show the observation of ``k`` steps ago (the episode's first one until then)."""

    def __init__(self, env: gym.Env, steps: int | tuple[int, int]):
        super().__init__(env)
        self.low, self.high = steps_range(steps, "ObservationDelay")
        self.queue: deque = deque()

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset and fill the queue with the first observation."""
        obs, info = self.env.reset(**kwargs)
        delay = int(self.np_random.integers(self.low, self.high + 1))
        self.queue = deque([obs] * (delay + 1), maxlen=delay + 1)
        return obs, info

    def step(self, action: Any) -> tuple:
        """Step; return the delayed observation (``info["true_obs"]`` holds the current one)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.queue.append(obs)
        return self.queue[0], reward, terminated, truncated, {**info, "true_obs": obs}


class ActionFilter(gym.ActionWrapper):
    """``u_t = alpha * a_t + (1 - alpha) * u_{t-1}``, from zero each episode."""

    def __init__(self, env: gym.Env, alpha: float):
        super().__init__(env)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"ActionFilter: alpha must be in (0, 1], got {alpha}.")
        self.alpha = float(alpha)
        self.u = np.zeros(env.action_space.shape)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset the filter to zero."""
        self.u = np.zeros(self.action_space.shape)
        return self.env.reset(**kwargs)

    def action(self, action: Any) -> np.ndarray:
        """The filtered action."""
        self.u = self.alpha * np.asarray(action) + (1.0 - self.alpha) * self.u
        return self.u.astype(self.action_space.dtype)


__all__ = ["ActionDelay", "ActionFilter", "ObservationDelay", "ObservationNoise"]
