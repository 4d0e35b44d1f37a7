"""Gymnasium equivalents of the sim-to-real wrappers (``jaxrl.envs.sim2real``) for host envs.

Same semantics as the JAX versions, on one ``gymnasium.Env``: wrap each env before it is
vectorized (``gymnasium.vector.SyncVectorEnv([lambda: ActionDelay(gym.make(id), 2)])``), or
name them in a host env id, ``HalfCheetah-v5?obs_noise=0.05&action_delay=1:3`` (``wrap``,
used by ``jaxrl.envs.make_env``). Per-episode state restarts in ``reset``; the RNG is the env's
``np_random``, so ``reset(seed=)`` makes the noise and the drawn delays reproducible.

The stateful wrappers (``STATEFUL``) have ``get_state()`` / ``set_state()`` with JSON-able
values, so ``HostEnv`` saves them with the MuJoCo physics and a resumed run is bit-identical.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from jaxrl.envs.ids import HOST_OPTIONS, add_option_wrappers, steps_range
from jaxrl.envs.ids import check_host_options as check_options
from jaxrl.envs.pushes import push_schedule


def _encode(array: np.ndarray) -> dict[str, Any]:
    """``array`` as JSON-able data that ``_decode`` turns back into the same bits."""
    array = np.asarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": array.ravel().tolist()}


def _decode(data: dict[str, Any]) -> np.ndarray:
    return np.asarray(data["data"], np.dtype(data["dtype"])).reshape(data["shape"])


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
        self.queue.append(np.array(action))  # a copy: vector envs pass views of their batch
        return self.env.step(self.queue.popleft())

    def get_state(self) -> dict[str, Any]:
        """The episode's delay and the queued actions."""
        return {"delay": self.delay, "queue": [_encode(a) for a in self.queue]}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        self.delay, self.queue = int(state["delay"]), deque(_decode(a) for a in state["queue"])


class ObservationDelay(gym.Wrapper):
    """Show the observation of ``k`` steps ago (the episode's first one until then).

    Unlike the JAX version, whose ``final_obs`` (what the fused loop stores as the next
    observation) is the true one, a host env's transitions hold what this wrapper shows,
    the last observation of an episode included; ``info["true_obs"]`` has the true one.
    """

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

    def get_state(self) -> dict[str, Any]:
        """The queued observations (their number is the episode's delay + 1)."""
        return {"queue": [_encode(o) for o in self.queue]}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        queue = [_decode(o) for o in state["queue"]]
        self.queue = deque(queue, maxlen=len(queue))


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

    def get_state(self) -> dict[str, Any]:
        """The filter's memory ``u``."""
        return {"u": _encode(self.u)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        self.u = _decode(state["u"])


class ObservationHistory(gym.Wrapper):
    """Observations of the last ``k`` steps, oldest first, concatenated (``k * size`` wide).

    At an episode's start the history is its first observation repeated. The observation that
    ends an episode (Gymnasium's ``final_obs``) is the history ending with the last one; the
    next episode starts its own history at ``reset``.

    Args:
        env: the env to wrap; its observations must be a flat ``Box``.
        k: steps of history, >= 1.
    """

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        space = env.observation_space
        if k < 1:
            raise ValueError(f"ObservationHistory: k must be >= 1, got {k}.")
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(
                f"ObservationHistory: needs a flat Box observation space, got {space}; wrap "
                "the env with gymnasium.wrappers.FlattenObservation first."
            )
        self.k = int(k)
        self.observation_space = gym.spaces.Box(
            np.tile(space.low, self.k), np.tile(space.high, self.k), dtype=space.dtype
        )
        self.history: deque = deque(maxlen=self.k)

    def _stacked(self) -> np.ndarray:
        return np.concatenate(list(self.history))

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        """Reset; the history is the first observation ``k`` times."""
        obs, info = self.env.reset(**kwargs)
        self.history = deque([obs] * self.k, maxlen=self.k)
        return self._stacked(), info

    def step(self, action: Any) -> tuple:
        """Step and append the new observation (dropping the oldest)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.history.append(obs)
        return self._stacked(), reward, terminated, truncated, info

    def get_state(self) -> dict[str, Any]:
        """The last ``k`` observations, oldest first."""
        return {"history": [_encode(o) for o in self.history]}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        self.history = deque((_decode(o) for o in state["history"]), maxlen=self.k)


class ControlDecimation(gym.Wrapper):
    """Hold each action for ``k`` simulator steps (a policy at 1/k of the simulation rate).

    The reward is the sum over the sub-steps. An episode that terminates or is truncated
    within them ends the agent step there, with that sub-step's observation, flags and info.
    Put it directly on the simulator (``gym.make``'s env, whose time limit counts sub-steps,
    so an episode has ``ceil(max_episode_steps / k)`` agent steps) and the other wrappers
    outside, as ``wrap`` does.

    Args:
        env: the env to wrap.
        k: simulator steps per agent step, >= 1.
    """

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        if k < 1:
            raise ValueError(f"ControlDecimation: k must be >= 1, got {k}.")
        self.k = int(k)

    def step(self, action: Any) -> tuple:
        """Up to ``k`` sub-steps with ``action``; the reward is their sum."""
        total = 0.0
        for _ in range(self.k):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


class Pushes(gym.Wrapper):
    """Random pushes on a MuJoCo env: velocity kicks of random direction and speed on the root.

    As ``jaxrl.envs.pushes.Pushes`` for Brax envs: every ``interval`` steps (drawn per push), a
    direction in the ground plane and a speed from ``speed`` (m/s) are drawn and added to the
    root's velocity, spread over ``duration`` steps; a free root (Ant, humanoids) gets them on
    its x and y velocity, otherwise the first joint (a cart, a hip slider) gets the x part. The
    countdown restarts at every reset.

    Args:
        env: a Gymnasium MuJoCo env (``env.unwrapped.data``).
        speed: ``(low, high)`` of the kick's speed in m/s.
        interval: ``(low, high)`` steps between pushes, inclusive.
        duration: steps a push lasts, >= 1.
    """

    def __init__(
        self,
        env: gym.Env,
        speed: tuple[float, float] = (0.1, 1.0),
        interval: tuple[int, int] = (100, 200),
        duration: int = 1,
    ):
        super().__init__(env)
        self.speed, self.interval, self.duration = push_schedule(speed, interval, duration)
        data, model = getattr(env.unwrapped, "data", None), getattr(env.unwrapped, "model", None)
        if data is None or type(model).__name__ != "MjModel":
            raise ValueError("Pushes kick a MuJoCo simulator: use a Gymnasium MuJoCo env.")
        self.free_root = bool(model.njnt) and int(model.jnt_type[0]) == 0  # mjJNT_FREE
        self.countdown, self.remaining, self.dv = self.interval[1], 0, np.zeros(2)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset and schedule the episode's first push."""
        out = self.env.reset(**kwargs)
        self.countdown = int(self.np_random.integers(self.interval[0], self.interval[1] + 1))
        self.remaining, self.dv = 0, np.zeros(2)
        return out

    def step(self, action: Any) -> tuple:
        """Kick when a push is due (or lasting), then step."""
        self.countdown -= 1
        if self.countdown <= 0:
            angle = self.np_random.uniform(0.0, 2 * np.pi)
            speed = self.np_random.uniform(*self.speed)
            self.dv = speed * np.array([np.cos(angle), np.sin(angle)]) / self.duration
            self.remaining = self.duration
            self.countdown = int(self.np_random.integers(self.interval[0], self.interval[1] + 1))
        if self.remaining > 0:
            qvel = self.env.unwrapped.data.qvel
            if self.free_root:
                qvel[:2] += self.dv
            else:
                qvel[0] += self.dv[0]
            self.remaining -= 1
        return self.env.step(action)

    def get_state(self) -> dict[str, Any]:
        """The countdown and the push in progress."""
        return {"countdown": self.countdown, "remaining": self.remaining, "dv": self.dv.tolist()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        self.countdown, self.remaining = int(state["countdown"]), int(state["remaining"])
        self.dv = np.asarray(state["dv"], np.float64)


STATEFUL = (ActionDelay, ObservationDelay, ActionFilter, ObservationHistory, Pushes)
"""Wrappers with per-episode state (``get_state`` / ``set_state``); ``HostEnv`` saves them."""


_WRAPPERS = (  # innermost first, the order of sim2real.wrap_actuation then wrap_agent_side
    ("push_speed", Pushes),
    ("decimation", ControlDecimation),
    ("action_filter", ActionFilter),
    ("action_delay", ActionDelay),
    ("obs_delay", ObservationDelay),
    ("obs_noise", ObservationNoise),
    ("obs_history", ObservationHistory),
)


def wrap(env: gym.Env, options: dict[str, Any], env_id: str = "") -> gym.Env:
    """``env`` in the wrappers that ``options`` name, in the order the JAX env ids use.

    ``decimation`` is innermost (on the simulator); then ``action_filter``, ``action_delay``
    (the agent's command is delayed, then filtered), ``obs_delay``, ``obs_noise`` and
    ``obs_history`` outermost (observations are delayed, made noisy, then stacked).

    Args:
        env: one unvectorized env (``gym.make(id)``).
        options: host env-id options (``HOST_OPTIONS``), e.g. ``{"action_delay": "1:3"}``;
            checked with ``check_options`` (``jaxrl.envs.ids.check_host_options``).
        env_id: the full id, for error messages.

    Returns:
        The wrapped env (``env`` itself when ``options`` is empty).

    Raises:
        EnvError: an option is unknown, Brax-only, or has an unusable value.
    """
    check_options(options, env_id)
    return add_option_wrappers(env, _WRAPPERS, options, env_id)


__all__ = [
    "HOST_OPTIONS",
    "STATEFUL",
    "ActionDelay",
    "ActionFilter",
    "ControlDecimation",
    "Pushes",
    "ObservationDelay",
    "ObservationHistory",
    "ObservationNoise",
    "check_options",
    "wrap",
]
