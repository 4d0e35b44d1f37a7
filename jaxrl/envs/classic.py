"""Small pure-JAX continuous-control environments (pendulum, cart-pole swing-up, point mass).

Each class is a single-environment *core*: ``reset(key) -> (state, obs)`` and
``step(state, action) -> (state, obs, reward, terminated)``, all float32, jit- and vmap-able.
Cores take actions in their native bounds (``action_low``/``action_high``) and never truncate or
auto-reset: the vectorizing layer in ``jaxrl.envs.jax_envs`` adds the time limit
(``episode_length``), auto-reset, action rescaling from ``[-1, 1]`` and episode statistics.
The simulator state is a flat float32 array documented on each class. Instances are frozen
dataclasses of Python floats, so they are hashable and can be passed as static arguments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxrl.errors import EnvError

StepOut = tuple[jax.Array, jax.Array, jax.Array, jax.Array]


def angle_normalize(x: jax.Array) -> jax.Array:
    """Wraps an angle to ``[-pi, pi)``."""
    return jnp.mod(x + jnp.pi, 2 * jnp.pi) - jnp.pi


def _gaussian_tolerance(x: jax.Array, margin: float) -> jax.Array:
    # dm_control's `tolerance(x, bounds=(0, 0), margin, sigmoid="gaussian")`: 1 at 0, 0.1 at margin.
    return jnp.power(0.1, jnp.square(x / margin))


def _validate(env: Any) -> None:
    # Bad parameters (e.g. a string from an env-id query) would otherwise fail deep inside tracing.
    cls = type(env).__name__
    for field in dataclasses.fields(env):
        value = getattr(env, field.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise EnvError(f"{cls}.{field.name} must be a number >= 0, got {value!r}.")
    substeps = getattr(env, "substeps", 1)
    if env.dt <= 0 or not isinstance(substeps, int) or substeps < 1:
        raise EnvError(f"{cls} needs dt > 0 and an integer substeps >= 1; got {env}.")


@dataclasses.dataclass(frozen=True)
class Pendulum:
    """Gymnasium's ``Pendulum-v1``: swing a torque-limited pendulum up and hold it there.

    Dynamics, reward, observation and initial-state distribution are those of Gymnasium 1.x
    (``thdot += (3g/(2l) sin(th) + 3/(m l^2) u) dt``, clipped to ``max_speed``; then
    ``th += thdot dt``). The reward ``-(angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2)`` is
    computed from the state *before* the step, in ``[-16.2736044, 0]`` by default. Never terminates.

    State: ``[th, thdot]`` with ``th`` kept in ``[-pi, pi)`` (Gymnasium lets it grow unbounded;
    wrapping keeps float32 precision and changes neither observation nor reward).
    Observation: ``[cos th, sin th, thdot]``. Action: torque in ``[-max_torque, max_torque]``.
    """

    g: float = 10.0
    m: float = 1.0
    l: float = 1.0  # noqa: E741  (Gymnasium's name for the pendulum length)
    dt: float = 0.05
    max_speed: float = 8.0
    max_torque: float = 2.0
    __post_init__ = _validate

    name: ClassVar[str] = "pendulum"
    observation_size: ClassVar[int] = 3
    action_size: ClassVar[int] = 1
    episode_length: ClassVar[int] = 200
    can_terminate: ClassVar[bool] = False

    action_low = property(lambda self: -self.max_torque)
    action_high = property(lambda self: self.max_torque)
    reward_range = property(
        lambda self: (-(math.pi**2 + 0.1 * self.max_speed**2 + 0.001 * self.max_torque**2), 0.0)
    )

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Samples ``th ~ U[-pi, pi]``, ``thdot ~ U[-1, 1]``; returns ``(state, obs)``."""
        state = jax.random.uniform(key, (2,), jnp.float32, -1.0, 1.0) * jnp.array([jnp.pi, 1.0])
        return state, self._obs(state)

    def step(self, state: jax.Array, action: jax.Array) -> StepOut:
        """Advances one ``dt``; returns ``(state, obs, reward, terminated)``."""
        th, thdot = state[0], state[1]
        u = jnp.clip(action[0], -self.max_torque, self.max_torque)
        cost = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        acc = 3 * self.g / (2 * self.l) * jnp.sin(th) + 3.0 / (self.m * self.l**2) * u
        thdot = jnp.clip(thdot + acc * self.dt, -self.max_speed, self.max_speed)
        new = jnp.stack([angle_normalize(th + thdot * self.dt), thdot]).astype(jnp.float32)
        return new, self._obs(new), (-cost).astype(jnp.float32), jnp.zeros((), jnp.float32)

    def _obs(self, state: jax.Array) -> jax.Array:
        return jnp.stack([jnp.cos(state[0]), jnp.sin(state[0]), state[1]]).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class CartPoleSwingUp:
    """Cart-pole swing-up with dm_control's smooth reward (``cartpole-swingup``-like).

    A uniform pole (mass ``pole_mass``, length ``2 * half_length``) hinges on a frictionless cart
    driven by force ``max_force * a``, ``a in [-1, 1]``. Rigid-body equations (Barto et al. 1983,
    corrected form) are integrated with semi-implicit Euler, ``substeps`` per control step ``dt``.
    The cart stops at hard end stops ``|x| = track_limit``: the impact is perfectly inelastic and
    passes the matching impulse to the pole, so the episode never terminates.

    Reward (in ``[0, 1]``, after the step): ``(1 + cos th) / 2 * (1 + tol(x, 2)) / 2 *
    (4 + 1 - a^2) / 5 * (1 + tol(thdot, 5)) / 2`` with ``tol(v, m) = 0.1 ** ((v / m)^2)``.
    It is ~0 hanging down and 1 upright, centered, still and unforced.

    State: ``[x, th, xdot, thdot]``, ``th = 0`` upright, positive tipping towards ``+x``.
    Observation: ``[x, cos th, sin th, xdot, thdot]``. Starts hanging down
    (``th = pi``) with ``N(0, 0.01^2)`` noise on every state variable.
    """

    cart_mass: float = 1.0
    pole_mass: float = 0.1
    half_length: float = 0.5
    gravity: float = 9.81
    max_force: float = 10.0
    track_limit: float = 1.8
    dt: float = 0.02
    substeps: int = 4
    __post_init__ = _validate

    name: ClassVar[str] = "cartpole_swingup"
    observation_size: ClassVar[int] = 5
    action_size: ClassVar[int] = 1
    action_low: ClassVar[float] = -1.0
    action_high: ClassVar[float] = 1.0
    episode_length: ClassVar[int] = 500
    can_terminate: ClassVar[bool] = False
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Pole hanging down with small Gaussian noise; returns ``(state, obs)``."""
        state = jnp.array([0.0, jnp.pi, 0.0, 0.0]) + 0.01 * jax.random.normal(key, (4,))
        return state.astype(jnp.float32), self._obs(state)

    def step(self, state: jax.Array, action: jax.Array) -> StepOut:
        """Advances ``dt`` in ``substeps`` steps; returns ``(state, obs, reward, terminated)``."""
        a = jnp.clip(action[0], -1.0, 1.0)
        force, h = self.max_force * a, self.dt / self.substeps
        total, ml = self.cart_mass + self.pole_mass, self.pole_mass * self.half_length

        def substep(_, s: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            x, th, xdot, thdot = s
            sin, cos = jnp.sin(th), jnp.cos(th)
            temp = (force + ml * thdot**2 * sin) / total
            thacc = (self.gravity * sin - cos * temp) / (
                self.half_length * (4.0 / 3.0 - self.pole_mass * cos**2 / total)
            )
            xdot = xdot + h * (temp - ml * thacc * cos / total)
            thdot = thdot + h * thacc
            x, th = x + h * xdot, th + h * thdot
            # End stop: the wall's impulse zeroes xdot; via the hinge d(thdot) = -3 cos d(xdot)/4l.
            hit = (jnp.abs(x) > self.track_limit) & (x * xdot > 0)
            thdot = thdot + jnp.where(hit, 0.75 * jnp.cos(th) * xdot / self.half_length, 0.0)
            xdot = jnp.where(hit, 0.0, xdot)
            return jnp.clip(x, -self.track_limit, self.track_limit), th, xdot, thdot

        x, th, xdot, thdot = jax.lax.fori_loop(0, self.substeps, substep, tuple(state))
        new = jnp.stack([x, angle_normalize(th), xdot, thdot]).astype(jnp.float32)
        upright = (1.0 + jnp.cos(th)) / 2
        centered = (1.0 + _gaussian_tolerance(x, 2.0)) / 2
        small_control = (4.0 + 1.0 - a**2) / 5
        small_velocity = (1.0 + _gaussian_tolerance(thdot, 5.0)) / 2
        reward = (upright * centered * small_control * small_velocity).astype(jnp.float32)
        return new, self._obs(new), reward, jnp.zeros((), jnp.float32)

    def _obs(self, state: jax.Array) -> jax.Array:
        x, th, xdot, thdot = state[0], state[1], state[2], state[3]
        return jnp.stack([x, jnp.cos(th), jnp.sin(th), xdot, thdot]).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class PointMass:
    """A damped 2-D point mass in the box ``[-arena, arena]^2`` that should reach the origin.

    ``v += (max_accel * a - damping * v) dt; p += v dt`` with ``a in [-1, 1]^2``; walls stop the
    mass (position clipped, outward velocity zeroed). Reward ``-|p|`` (before the step), in
    ``[-sqrt(2) arena, 0]``. Never terminates.

    State: ``[px, py, vx, vy]``. Observation: the state. Starts at rest, ``p ~ U[-arena, arena]^2``.
    """

    arena: float = 1.0
    max_accel: float = 2.0
    damping: float = 0.5
    dt: float = 0.05
    __post_init__ = _validate

    name: ClassVar[str] = "point_mass"
    observation_size: ClassVar[int] = 4
    action_size: ClassVar[int] = 2
    action_low: ClassVar[float] = -1.0
    action_high: ClassVar[float] = 1.0
    episode_length: ClassVar[int] = 100
    can_terminate: ClassVar[bool] = False

    reward_range = property(lambda self: (-math.sqrt(2) * self.arena, 0.0))

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Uniform position in the arena, zero velocity; returns ``(state, obs)``."""
        pos = jax.random.uniform(key, (2,), jnp.float32, -self.arena, self.arena)
        state = jnp.concatenate([pos, jnp.zeros(2, jnp.float32)])
        return state, state

    def step(self, state: jax.Array, action: jax.Array) -> StepOut:
        """Advances one ``dt``; returns ``(state, obs, reward, terminated)``."""
        pos, vel = state[:2], state[2:]
        reward = -jnp.linalg.norm(pos)
        a = jnp.clip(action, -1.0, 1.0)
        vel = vel + (self.max_accel * a - self.damping * vel) * self.dt
        pos = pos + vel * self.dt
        vel = jnp.where((jnp.abs(pos) > self.arena) & (pos * vel > 0), 0.0, vel)
        pos = jnp.clip(pos, -self.arena, self.arena)
        new = jnp.concatenate([pos, vel]).astype(jnp.float32)
        return new, new, reward.astype(jnp.float32), jnp.zeros((), jnp.float32)


CLASSIC_ENVS: dict[str, type] = {cls.name: cls for cls in (Pendulum, CartPoleSwingUp, PointMass)}


def make_classic(name: str, **kwargs: float) -> Pendulum | CartPoleSwingUp | PointMass:
    """Builds a classic pure-JAX environment core by name.

    Args:
        name: one of ``CLASSIC_ENVS`` (``"pendulum"``, ``"cartpole_swingup"``, ``"point_mass"``).
        **kwargs: physical parameters of that env's dataclass (e.g. ``g=9.81`` for the pendulum).

    Returns:
        The environment core.

    Raises:
        EnvError: on an unknown name or parameter (a ``ValueError``).
    """
    if name not in CLASSIC_ENVS:
        raise EnvError(
            f"Unknown classic environment {name!r}; known: {', '.join(sorted(CLASSIC_ENVS))}."
        )
    cls = CLASSIC_ENVS[name]
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise EnvError(
            f"Environment {name!r} has no parameter(s) {unknown}; its parameters are {fields}."
        )
    return cls(**kwargs)
