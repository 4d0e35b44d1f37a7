"""Sim-to-real wrappers for JAX envs: sensor noise, delays, action filtering, decimation, history.

Each is a pure transform on the JAX env protocol (``reset(key)``, ``step(state, action)`` over
``[num_envs, ...]`` states) with its state in ``state.extras[<name>]``, so it is carried by the
fused loop's ``lax.scan``, vmapped over seeds and saved in checkpoints with the env state. They
compose with the other wrappers, e.g.
``ObservationNoise(ActionDelay(RescaleAction(VecEnv(core, n), lo, hi), steps=2), scale=0.01)``.

Per-episode state (delay queues, filter memory, histories, per-episode delays) restarts where an
episode ended (``terminated`` or ``truncation`` after the step): the wrapped env has already
auto-reset there, so the next step belongs to a new episode. ``info["final_obs"]`` (the true
last observation of the ended episode, for bootstrapping) goes through the same observation
transform as ``obs``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.envs.ids import OPTIONS, add_option_wrappers, option_value, steps_range
from jaxrl.envs.pushes import Pushes, push_schedule
from jaxrl.envs.state import EnvState, episode_ended, where_per_env
from jaxrl.envs.wrappers import Wrapper

_PER_ENV = ("sim", "obs", "terminated", "truncation", "time", "key", "info")
"""``EnvState`` fields whose every leaf has a leading env axis."""


class ObservationNoise(Wrapper):
    """Add Gaussian noise ``N(0, scale^2)`` per observation channel (a sensor model).

    Args:
        env: the env to wrap.
        scale: standard deviation, a scalar or one value per channel (``[observation_size]``).
        seed: seed of the noise stream (kept in ``extras["obs_noise"]``).
    """

    def __init__(self, env: Any, scale: Any, seed: int = 0):
        super().__init__(env)
        scale = np.broadcast_to(np.asarray(scale, np.float32), (env.observation_size,)).copy()
        if np.any(scale < 0) or not np.all(np.isfinite(scale)):
            raise ValueError(f"ObservationNoise: scale must be finite and >= 0, got {scale}.")
        self.scale, self.seed = scale, seed

    def reset(self, key: jax.Array) -> EnvState:
        """Reset and add noise to the first observations."""
        state = self.env.reset(key)
        return self._noisy(state, jax.random.fold_in(key, self.seed + 7919))

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step, then add fresh noise to ``obs`` and ``final_obs``."""
        key = state.extras["obs_noise"]
        return self._noisy(self.env.step(state, action), key)

    def _noisy(self, state: EnvState, key: jax.Array) -> EnvState:
        key, k_obs, k_final = jax.random.split(key, 3)
        shape = state.obs.shape
        obs = state.obs + self.scale * jax.random.normal(k_obs, shape)
        final = state.info["final_obs"] + self.scale * jax.random.normal(k_final, shape)
        return state.replace(
            obs=obs,
            info={**state.info, "final_obs": final},
            extras={**state.extras, "obs_noise": key},
        )


class Delay(Wrapper):
    """Base of the delay wrappers: a delay of ``k`` steps, or one drawn per episode.

    Args:
        env: the env to wrap.
        steps: ``k >= 0`` or ``(low, high)``, inclusive.
    """

    def __init__(self, env: Any, steps: int | tuple[int, int]):
        super().__init__(env)
        self.low, self.high = steps_range(steps, type(self).__name__)


class ActionDelay(Delay):
    """Apply each action ``k`` steps after the agent chose it (actuation latency).

    ``steps`` is a fixed ``k`` or a range ``(low, high)`` from which each env draws its delay at
    every episode start (kept in ``extras["action_delay"]["steps"]``, so it can be logged). Until
    ``k`` actions of the episode have been chosen, the env receives zeros.

    ``steps`` as in ``Delay``.
    """

    def _fresh(self, key: jax.Array) -> dict[str, jax.Array]:
        n, a = self.num_envs, self.action_size
        delay = jax.random.randint(key, (n,), self.low, self.high + 1)
        return {"queue": jnp.zeros((n, self.high + 1, a), jnp.float32), "steps": delay}

    def reset(self, key: jax.Array) -> EnvState:
        """Reset with empty queues and each env's delay drawn."""
        state = self.env.reset(key)
        k_delay, k_next = jax.random.split(jax.random.fold_in(key, 104_729))
        delay = {**self._fresh(k_delay), "key": k_next}
        return state.replace(extras={**state.extras, "action_delay": delay})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Queue ``action``, step with the one chosen ``k`` steps ago; restart ended episodes."""
        d = state.extras["action_delay"]
        queue = jnp.concatenate([action[:, None].astype(jnp.float32), d["queue"][:, :-1]], 1)
        applied = queue[jnp.arange(self.num_envs), d["steps"]]
        state = self.env.step(state, applied)
        key, k_new = jax.random.split(d["key"])
        fresh, ended = self._fresh(k_new), episode_ended(state)
        delay = {
            "queue": where_per_env(ended, fresh["queue"], queue),
            "steps": jnp.where(ended, fresh["steps"], d["steps"]),
            "key": key,
        }
        return state.replace(extras={**state.extras, "action_delay": delay})


class ObservationDelay(Delay):
    """Show the agent the observation of ``k`` steps ago (sensing latency).

    ``steps`` is a fixed ``k`` or a range ``(low, high)`` drawn per env at each episode start.
    At an episode's start the queue holds its first observation, so the agent sees that one
    until ``k`` steps have passed. ``final_obs`` stays the true last observation: it is what
    the critic bootstraps from, not what the policy acts on.

    ``steps`` as in ``Delay``.
    """

    def _fill(self, obs: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
        queue = jnp.repeat(obs[:, None], self.high + 1, axis=1)
        delay = jax.random.randint(key, (self.num_envs,), self.low, self.high + 1)
        return {"queue": queue, "steps": delay}

    def _show(self, state: EnvState, d: dict[str, jax.Array]) -> EnvState:
        obs = d["queue"][jnp.arange(self.num_envs), d["steps"]]
        return state.replace(obs=obs, extras={**state.extras, "obs_delay": d})

    def reset(self, key: jax.Array) -> EnvState:
        """Reset; every queue holds its episode's first observation."""
        state = self.env.reset(key)
        k_fill, k_next = jax.random.split(jax.random.fold_in(key, 1_299_709))
        return self._show(state, {**self._fill(state.obs, k_fill), "key": k_next})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step; push the new observation and show the delayed one."""
        d = state.extras["obs_delay"]
        state = self.env.step(state, action)
        key, k_new = jax.random.split(d["key"])
        queue = jnp.concatenate([state.obs[:, None], d["queue"][:, :-1]], 1)
        fresh, ended = self._fill(state.obs, k_new), episode_ended(state)
        d = {
            "queue": where_per_env(ended, fresh["queue"], queue),
            "steps": jnp.where(ended, fresh["steps"], d["steps"]),
            "key": key,
        }
        return self._show(state, d)


class ActionFilter(Wrapper):
    """First-order low-pass filter on actions: ``u_t = alpha * a_t + (1 - alpha) * u_{t-1}``.

    ``u`` starts at zero in every episode. ``alpha = 1`` passes actions through.

    Args:
        env: the env to wrap.
        alpha: the new action's weight, in ``(0, 1]``.
    """

    def __init__(self, env: Any, alpha: float):
        super().__init__(env)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"ActionFilter: alpha must be in (0, 1], got {alpha}.")
        self.alpha = float(alpha)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset with the filter at zero."""
        state = self.env.reset(key)
        zeros = jnp.zeros((self.num_envs, self.action_size), jnp.float32)
        return state.replace(extras={**state.extras, "action_filter": zeros})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Filter, step, and restart the filter where the episode ended."""
        u = self.alpha * action + (1.0 - self.alpha) * state.extras["action_filter"]
        state = self.env.step(state, u)
        u = where_per_env(episode_ended(state), jnp.zeros_like(u), u)
        return state.replace(extras={**state.extras, "action_filter": u})


class ObservationHistory(Wrapper):
    """Observations of the last ``k`` steps, oldest first, concatenated (``k * size`` wide).

    At an episode's start the history is its first observation repeated. ``final_obs`` is the
    history ending with the true last observation.

    Args:
        env: the env to wrap.
        k: steps of history, >= 1.
    """

    def __init__(self, env: Any, k: int):
        super().__init__(env)
        if k < 1:
            raise ValueError(f"ObservationHistory: k must be >= 1, got {k}.")
        self.k = int(k)
        self.observation_size = self.k * int(env.observation_size)

    def _flat(self, history: jax.Array) -> jax.Array:
        return history.reshape(history.shape[0], -1)

    def reset(self, key: jax.Array) -> EnvState:
        """Reset; the history is the first observation ``k`` times."""
        state = self.env.reset(key)
        history = jnp.repeat(state.obs[:, None], self.k, axis=1)
        return state.replace(
            obs=self._flat(history),
            info={**state.info, "final_obs": self._flat(history)},
            extras={**state.extras, "obs_history": history},
        )

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """Step; append the new observation (a new episode starts its own history)."""
        history = state.extras["obs_history"]
        state = self.env.step(state, action)
        final = jnp.concatenate([history[:, 1:], state.info["final_obs"][:, None]], 1)
        fresh = jnp.repeat(state.obs[:, None], self.k, axis=1)
        history = where_per_env(episode_ended(state), fresh, final)
        return state.replace(
            obs=self._flat(history),
            info={**state.info, "final_obs": self._flat(final)},
            extras={**state.extras, "obs_history": history},
        )


class ControlDecimation(Wrapper):
    """Hold each action for ``k`` simulator steps (a policy at 1/k of the simulation rate).

    The reward is the sum over the ``k`` steps. An episode that ends within them ends the agent
    step there: later sub-steps leave that env's state unchanged (the env's own auto-reset
    already started the next episode), and ``final_obs``, ``terminated`` and ``truncation`` are
    those of the ending sub-step. ``episode_length`` counts agent steps. Wrap the bare env
    (``VecEnv``, ``RescaleAction``) with it and put the other wrappers outside: the frozen
    fields are the per-env ones (simulator, observations, flags, time, keys, info), and a
    wrapper inside would keep running for the frozen env.

    Args:
        env: the env to wrap.
        k: simulator steps per agent step, >= 1.
    """

    def __init__(self, env: Any, k: int):
        super().__init__(env)
        if k < 1:
            raise ValueError(f"ControlDecimation: k must be >= 1, got {k}.")
        self.k = int(k)
        self.episode_length = -(-int(env.episode_length) // self.k)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        """``k`` sub-steps under ``lax.scan``, frozen per env after its episode ends."""

        def sub(carry: tuple[EnvState, jax.Array, jax.Array], _: Any) -> tuple:
            state, total, done = carry
            new = self.env.step(state, action)
            kept = new.replace(
                **{
                    f: jax.tree.map(lambda a, b: where_per_env(done, a, b), getattr(state, f),
                                    getattr(new, f))
                    for f in _PER_ENV
                }
            )  # fmt: skip
            total = total + jnp.where(done, 0.0, new.reward)
            return (kept, total, done | episode_ended(new)), None

        # The first sub-step runs outside the scan: the incoming state may carry the outer
        # wrappers' observations (e.g. a history, wider than the simulator's), and the scan's
        # carry must keep one shape.
        first = self.env.step(state, action)
        init = (first, first.reward, episode_ended(first))
        (state, total, _), _ = jax.lax.scan(sub, init, None, length=self.k - 1)
        return state.replace(reward=total)


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` split into (these wrappers' options, the rest)."""
    ours = {k: v for k, v in options.items() if k in OPTIONS}
    return ours, {k: v for k, v in options.items() if k not in OPTIONS}


def wrap_actuation(env: Any, options: dict[str, Any], env_id: str = "") -> Any:
    """The wrappers on the simulator side of the action path (innermost, on ``VecEnv``).

    ``push_speed=LOW:HIGH`` (``Pushes``, Brax envs) and ``decimation=k``
    (``ControlDecimation``): they must see the bare env.

    Raises:
        EnvError: an option's value is unusable (``jaxrl.envs.ids.add_option_wrappers``).
    """
    # push_speed=LOW:HIGH m/s: a push every 100-200 steps
    actuation = (("push_speed", Pushes), ("decimation", ControlDecimation))
    return add_option_wrappers(env, actuation, options, env_id)


_AGENT_SIDE = (  # innermost first
    ("action_filter", ActionFilter),
    ("action_delay", ActionDelay),
    ("obs_delay", ObservationDelay),
    ("obs_noise", ObservationNoise),
    ("obs_history", ObservationHistory),
)


def wrap_agent_side(env: Any, options: dict[str, Any], core: Any = None, env_id: str = "") -> Any:
    """The wrappers between the agent and the env, in the order a robot sees them.

    Actions: the agent's command is delayed (``action_delay``), then low-pass filtered
    (``action_filter``), then applied. Observations: delayed (``obs_delay``), then noisy
    (``obs_noise``, the standard deviation of every channel), then stacked (``obs_history``).
    With ``privileged=true`` the clean observation and ``core``'s drawn physics are appended
    for the critic (``jaxrl.envs.privileged``).

    Raises:
        EnvError: an option's value is unusable (``jaxrl.envs.ids.add_option_wrappers``).
    """
    if "privileged" in options and option_value("privileged", options["privileged"]):
        from jaxrl.envs.privileged import wrap_privileged

        rest = {k: v for k, v in options.items() if k != "privileged"}
        return wrap_privileged(env, core, lambda e: wrap_agent_side(e, rest, env_id=env_id))
    return add_option_wrappers(env, _AGENT_SIDE, options, env_id)


__all__ = [
    "OPTIONS",
    "Delay",
    "ActionDelay",
    "ActionFilter",
    "ControlDecimation",
    "ObservationDelay",
    "ObservationHistory",
    "ObservationNoise",
    "split_options",
    "push_schedule",
    "steps_range",
    "wrap_actuation",
    "wrap_agent_side",
]
