"""Host environments: Gymnasium continuous-control envs vectorized with ``gymnasium.vector``.

Agents act in ``[-1, 1]``; ``HostEnv`` rescales to the env's bounds, returns the true final
observation of finished episodes (for bootstrapping) and can save/restore MuJoCo physics, RNG,
time-limit and sim-to-real wrapper state so that a resumed run continues exactly where it stopped.
An id may name sim-to-real wrappers as options, ``HalfCheetah-v5?obs_noise=0.05&action_delay=1:3``
(``jaxrl.envs.ids.split_env_id``; the wrappers are in ``jaxrl.envs.gym_sim2real``).
"""

from __future__ import annotations

import difflib
import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from jaxrl.envs.ids import is_jax_env, split_env_id
from jaxrl.errors import EnvError

EnvFactory = Callable[[], gym.Env]


@functools.cache
def _quiet_mujoco_warnings() -> None:
    # MuJoCo's default handler appends every warning to MUJOCO_LOG.TXT in the working directory
    # (Gymnasium's v5 models trigger a deprecation warning on load); send them to Python warnings.
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(lambda msg: warnings.warn(f"MuJoCo: {msg}", stacklevel=2))


def _resolve_factory(env_id: str, render: tuple[int, int] | None = None) -> EnvFactory:
    if is_jax_env(env_id):
        raise EnvError(
            f"Environment {env_id!r} is a JAX env: build it with jaxrl.envs.make_jax_env (the "
            "fused loop; `jaxrl train` does this), not make_env, which is for Gymnasium ids."
        )
    base, options = split_env_id(env_id)
    try:
        gym.spec(base)
    except gym.error.Error as err:
        close = difflib.get_close_matches(base, list(gym.registry.keys()), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise EnvError(
            f"Unknown environment id {base!r} ({err}).{hint} Run "
            '`python -c "import gymnasium; print(list(gymnasium.registry))"` to list ids.'
        ) from None
    kwargs: dict[str, Any] = {}
    if render is not None:  # frames of copy 0; MuJoCo envs render at the size asked for
        kwargs["render_mode"] = "rgb_array"
        # pygame (classic control) draws off-screen: no display, no audio, no banner.
        for var, value in (("SDL_VIDEODRIVER", "dummy"), ("SDL_AUDIODRIVER", "dummy")):
            os.environ.setdefault(var, value)
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        if "mujoco" in str(gym.spec(base).entry_point):
            kwargs["width"], kwargs["height"] = render
    if not options:
        return lambda: gym.make(base, **kwargs)
    from jaxrl.envs.gym_sim2real import wrap

    return lambda: wrap(gym.make(base, **kwargs), options, env_id)


def episode_length(env_id: str) -> int:
    """Steps in a full episode of ``env_id`` (its time limit; 1000 where it has none).

    Works for JAX env ids too (``jax:NAME``, ``brax:NAME``), so settings derived from the
    episode length (e.g. TD-MPC2's discount) need no knowledge of the env's kind. With
    ``decimation=k`` it counts agent steps, ``ceil(time limit / k)``, as for JAX envs.
    """
    if is_jax_env(env_id):
        from jaxrl.envs.jax_envs import make_jax_env

        return int(make_jax_env(env_id, 1).episode_length)
    _resolve_factory(env_id)  # a clear error for an unknown id or option
    base, options = split_env_id(env_id)
    steps = int(gym.spec(base).max_episode_steps or 1000)
    return -(-steps // options.get("decimation", 1))  # agent steps: the time limit counts sim steps


TERMINATING = (
    "InvertedPendulumEnv",
    "InvertedDoublePendulumEnv",
    "BipedalWalker",
    "LunarLander",
    "Continuous_MountainCarEnv",
    "CarRacing",
)
"""Gymnasium env classes whose episodes can terminate and that have no switch for it."""


def can_terminate(env_id: str) -> bool:
    """Whether an episode of ``env_id`` can end by termination, not only by its time limit.

    Read from the simulator: an env with a ``terminate_when_unhealthy`` setting (Gymnasium's
    and Brax's Ant, Hopper, Humanoid, Walker2d) can when it is on; the classes in
    ``TERMINATING`` (inverted pendulums, Box2D walker and lander, ...) always can; the
    ``jax:`` envs, HalfCheetah, Swimmer, Reacher, Pusher, HumanoidStandup and Pendulum never
    do. A Gymnasium env not covered by these is taken not to terminate.
    """
    if is_jax_env(env_id):
        from jaxrl.envs.jax_envs import make_core

        return bool(make_core(env_id)[0].can_terminate)
    _resolve_factory(env_id)  # a clear error for an unknown id or option
    _quiet_mujoco_warnings()
    env = gym.make(split_env_id(env_id)[0])
    try:
        sim = env.unwrapped
        return bool(getattr(sim, "_terminate_when_unhealthy", type(sim).__name__ in TERMINATING))
    finally:
        env.close()


def check_spaces(env_id: str, env: gym.Env) -> None:
    """Raise ``EnvError`` unless the env has flat Box observations and bounded Box actions."""
    act, obs = env.action_space, env.observation_space
    if not isinstance(act, gym.spaces.Box):
        raise EnvError(
            f"Environment {env_id!r} has a {type(act).__name__} action space; jaxrl agents need "
            "continuous (Box) actions. Use a continuous-control env such as 'Pendulum-v1'."
        )
    if not (np.all(np.isfinite(act.low)) and np.all(np.isfinite(act.high))):
        raise EnvError(f"Environment {env_id!r} has unbounded actions; wrap it with bounds.")
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise EnvError(
            f"Environment {env_id!r} has observation space {obs}; jaxrl needs a flat Box. Wrap it "
            "with gymnasium.wrappers.FlattenObservation."
        )


class HostEnv:
    """``num_envs`` copies of a Gymnasium env in a ``SyncVectorEnv`` (same-step autoreset).

    Attributes:
        env_id: the full id, options included (or a label when built from a factory).
        num_envs: number of parallel copies.
        obs_dim / action_dim: flat observation and action sizes.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        factory: EnvFactory | None = None,
        render: tuple[int, int] | None = None,
    ):
        if num_envs <= 0:
            raise EnvError(f"num_envs must be positive, got {num_envs}.")
        factory = factory or _resolve_factory(env_id, render)
        _quiet_mujoco_warnings()
        self.env_id, self.num_envs = env_id, num_envs
        self.vec = gym.vector.SyncVectorEnv(
            [factory for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        try:
            check_spaces(env_id, self.vec.envs[0])
        except EnvError:
            self.vec.close()
            raise
        space = self.vec.single_action_space
        self._low, self._high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.obs_dim = int(self.vec.single_observation_space.shape[0])
        self.action_dim = int(space.shape[0])
        self._obs: np.ndarray | None = None

    @property
    def action_low(self) -> np.ndarray:
        """Lower action bounds in the env's units (agents act in [-1, 1], rescaled to these)."""
        return self._low.astype(np.float32)

    @property
    def action_high(self) -> np.ndarray:
        """Upper action bounds in the env's units."""
        return self._high.astype(np.float32)

    @property
    def obs_example(self) -> np.ndarray:
        """A zero observation (float32) for initializing networks."""
        return np.zeros(self.obs_dim, np.float32)

    @property
    def action_example(self) -> np.ndarray:
        """A zero action (float32) for initializing networks."""
        return np.zeros(self.action_dim, np.float32)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every copy (copy ``i`` is seeded with ``seed + i``); returns ``[N, obs_dim]``."""
        obs, _ = self.vec.reset(seed=seed)
        self._obs = obs.astype(np.float32)
        return self._obs

    def step(self, action: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step with normalized actions in [-1, 1].

        Returns:
            ``(next_obs, obs, reward, terminated, truncated)`` where ``next_obs`` is the true
            successor of the previous observation (the final observation where an episode ended)
            and ``obs`` is what the agent sees next (a fresh reset observation there).
        """
        action = np.clip(np.asarray(action, np.float64), -1.0, 1.0)
        scaled = self._low + 0.5 * (action + 1.0) * (self._high - self._low)
        obs, reward, terminated, truncated, info = self.vec.step(scaled)
        obs = obs.astype(np.float32)
        next_obs = obs.copy()
        if "_final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                next_obs[i] = info["final_obs"][i]
        self._obs = obs
        return (
            next_obs,
            obs,
            reward.astype(np.float32),
            terminated.astype(bool),
            truncated.astype(bool),
        )

    def render(self) -> np.ndarray:
        """The current frame of copy 0 (``[H, W, 3]`` uint8); needs ``make_env(render=...)``."""
        return np.asarray(self.vec.envs[0].render())

    @property
    def frame_rate(self) -> float:
        """Frames per second of a real-time video: one frame per agent step."""
        sim = self.vec.envs[0].unwrapped
        dt = getattr(sim, "dt", None) or 1.0 / sim.metadata.get("render_fps", 30)
        return 1.0 / (float(dt) * split_env_id(self.env_id)[1].get("decimation", 1))

    # -------------------------------------------------------------------- savable simulator state

    @property
    def savable(self) -> bool:
        """True when the exact simulator state can be saved (MuJoCo-based Gymnasium envs)."""
        return all(_mujoco_parts(e) is not None for e in self.vec.envs)

    def get_state(self) -> dict[str, Any] | None:
        """JSON-serializable state of every copy, or None when the env cannot be saved exactly."""
        if not self.savable or self._obs is None:
            return None
        import mujoco

        envs = []
        for e in self.vec.envs:
            model, data = _mujoco_parts(e)
            spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
            physics = np.empty(mujoco.mj_stateSize(model, spec), np.float64)
            mujoco.mj_getState(model, data, physics, spec)
            envs.append(
                {
                    "physics": physics.tolist(),
                    "ctrl": data.ctrl.tolist(),
                    "np_random": e.unwrapped.np_random.bit_generator.state,
                    "elapsed_steps": _time_limit(e)._elapsed_steps if _time_limit(e) else None,
                    "wrappers": [
                        {"type": type(w).__name__, "state": w.get_state()}
                        for w in _stateful_wrappers(e)
                    ],
                }
            )
        return {"envs": envs, "obs": self._obs.tolist()}

    def set_state(self, state: dict[str, Any]) -> np.ndarray:
        """Restore a state from ``get_state`` (after ``reset``); returns the current observation."""
        import mujoco

        if len(state["envs"]) != self.num_envs:
            raise EnvError(
                f"Saved state has {len(state['envs'])} envs but this run has {self.num_envs}; "
                "resume with the same --num-envs."
            )
        for e, s in zip(self.vec.envs, state["envs"], strict=True):
            saved = [w["type"] for w in s.get("wrappers", [])]
            wrappers = [type(w).__name__ for w in _stateful_wrappers(e)]
            if saved != wrappers:  # checked before anything is restored
                raise EnvError(
                    f"Saved state has the sim-to-real wrappers {saved} but {self.env_id!r} has "
                    f"{wrappers}; resume with the same --env id (its options included)."
                )
        for e, s in zip(self.vec.envs, state["envs"], strict=True):
            model, data = _mujoco_parts(e)
            physics = np.asarray(s["physics"], np.float64)
            mujoco.mj_setState(model, data, physics, mujoco.mjtState.mjSTATE_FULLPHYSICS)
            data.ctrl[:] = s["ctrl"]
            mujoco.mj_forward(model, data)
            e.unwrapped.np_random.bit_generator.state = s["np_random"]
            if s["elapsed_steps"] is not None:
                _time_limit(e)._elapsed_steps = s["elapsed_steps"]
            for w, saved in zip(_stateful_wrappers(e), s.get("wrappers", []), strict=True):
                w.set_state(saved["state"])
        self._obs = np.asarray(state["obs"], np.float32)
        return self._obs

    def close(self) -> None:
        """Close the underlying simulators."""
        self.vec.close()


def _mujoco_parts(env: gym.Env) -> tuple[Any, Any] | None:
    u = env.unwrapped
    model, data = getattr(u, "model", None), getattr(u, "data", None)
    if model is None or data is None or type(model).__name__ != "MjModel":
        return None
    return model, data


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return env
        env = env.env
    return None


def _stateful_wrappers(env: gym.Env) -> list[Any]:
    """The ``gym_sim2real`` wrappers with per-episode state in ``env``'s chain, outermost first."""
    from jaxrl.envs.gym_sim2real import STATEFUL

    found = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, STATEFUL):
            found.append(env)
        env = env.env
    return found


def make_env(
    env_id: str,
    num_envs: int = 1,
    factory: EnvFactory | None = None,
    render: tuple[int, int] | None = None,
) -> HostEnv:
    """Build a ``HostEnv`` from a Gymnasium id (validated, with suggestions for typos).

    Args:
        env_id: a Gymnasium id, optionally with sim-to-real options after ``?``:
            ``decimation``, ``action_filter``, ``action_delay``, ``obs_delay``, ``obs_noise``,
            ``obs_history`` (``jaxrl.envs.gym_sim2real.HOST_OPTIONS``), e.g.
            ``HalfCheetah-v5?obs_noise=0.05&action_delay=1:3``. Each copy is wrapped before it
            is vectorized, in the order the JAX env ids use (``gym_sim2real.wrap``).
        num_envs: parallel copies.
        factory: builds one env instead of ``gym.make`` (``env_id`` is then only a label).
        render: ``(width, height)``: build the envs in ``rgb_array`` render mode
            (``HostEnv.render``; classic-control envs keep their own frame size). MuJoCo envs
            render through OpenGL: call ``jaxrl.envs.render.gl_backend`` first.

    Raises:
        EnvError: unknown id or option, a Brax-only option, or an unusable option value.
    """
    return HostEnv(env_id, num_envs, factory, render)
