"""Domain randomization of Brax (MJX) physics, drawn again at every episode reset.

Brax and MuJoCo Playground draw randomized models once per env slot, when the wrapper is built;
auto-reset then restores a cached first state with the same model. Here the model is part of
each env's simulator state (``BraxCore(..., randomize=Ranges())``): every reset, including the
auto-resets inside the fused loop's compiled program, calls ``randomize(model, key)`` with a
fresh key, so consecutive episodes of one env slot run on different physics without
recompiling, and the drawn values are in the env state (checkpointed with it).

Supported backend: ``mjx`` (it reads the MuJoCo model fields randomized here). Brax's
``generalized``, ``positional`` and ``spring`` pipelines read their own copies of these
quantities (``sys.link``, ``sys.dof``, ``sys.actuator``) and are refused with a clear error.

Default ranges are those MuJoCo Playground's Go1 joystick task uses, applied to any model:
friction ``U(0.4, 1.0)``, link masses ``x U(0.9, 1.1)``, torso mass ``+ U(-1, 1)`` kg, torso
centre of mass ``+ U(-0.05, 0.05)`` m per axis, armature ``x U(1, 1.05)``, and the gains of
position actuators (Kp, Kd) ``x U(0.9, 1.1)``; motors, which have no such gains (Ant,
HalfCheetah), keep theirs. ``qpos0`` offsets and damping scales are available and off by
default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

Range = tuple[float, float] | None


@dataclasses.dataclass(frozen=True)
class Ranges:
    """What varies between episodes, each a ``(low, high)`` of a uniform draw or None (fixed).

    Attributes:
        friction: sliding friction of every geom (absolute value).
        mass_scale: factor on every body's mass.
        torso_mass_add: kilograms added to the torso (body 1).
        com_offset: metres added to the torso's centre of mass, per axis.
        armature_scale: factor on every joint's armature.
        damping_scale: factor on every joint's damping.
        gain_scale: factor on the Kp and Kd of position actuators (affine bias), drawn
            independently for Kp and Kd of each actuator.
        qpos0_offset: added to the joints' reference positions (free-joint coordinates
            excluded).
    """

    friction: Range = (0.4, 1.0)
    mass_scale: Range = (0.9, 1.1)
    torso_mass_add: Range = (-1.0, 1.0)
    com_offset: Range = (-0.05, 0.05)
    armature_scale: Range = (1.0, 1.05)
    damping_scale: Range = None
    gain_scale: Range = (0.9, 1.1)
    qpos0_offset: Range = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            r = getattr(self, f.name)
            if r is not None and not (len(r) == 2 and r[0] <= r[1]):
                raise ValueError(f"Ranges.{f.name} must be (low, high) with low <= high, got {r}.")


def _u(key: jax.Array, r: tuple[float, float], shape: tuple[int, ...]) -> jax.Array:
    return jax.random.uniform(key, shape, jnp.float32, r[0], r[1])


def randomize(model: Any, key: jax.Array, ranges: Ranges) -> Any:
    """A copy of the MuJoCo/MJX ``model`` (a Brax ``System``) with parameters drawn in ``ranges``.

    Pure and traceable: call it under ``jit`` / ``vmap`` with a fresh key per episode.
    """
    keys = iter(jax.random.split(key, 9))
    new: dict[str, Any] = {}
    if ranges.friction is not None:
        friction = jnp.asarray(model.geom_friction)
        new["geom_friction"] = friction.at[:, 0].set(
            _u(next(keys), ranges.friction, (len(friction),))
        )
    mass = jnp.asarray(model.body_mass)
    if ranges.mass_scale is not None:
        mass = mass * _u(next(keys), ranges.mass_scale, mass.shape)
    if ranges.torso_mass_add is not None:
        mass = mass.at[1].add(_u(next(keys), ranges.torso_mass_add, ()))
        mass = jnp.maximum(mass, 1e-3 * (mass > 0))  # never a negative mass
    new["body_mass"] = mass
    if ranges.com_offset is not None:
        ipos = jnp.asarray(model.body_ipos)
        new["body_ipos"] = ipos.at[1].add(_u(next(keys), ranges.com_offset, (3,)))
    if ranges.armature_scale is not None:
        armature = jnp.asarray(model.dof_armature)
        new["dof_armature"] = armature * _u(next(keys), ranges.armature_scale, armature.shape)
    if ranges.damping_scale is not None:
        damping = jnp.asarray(model.dof_damping)
        new["dof_damping"] = damping * _u(next(keys), ranges.damping_scale, damping.shape)
    if ranges.gain_scale is not None:
        gain, bias = jnp.asarray(model.actuator_gainprm), jnp.asarray(model.actuator_biasprm)
        n = gain.shape[0]
        # Position actuators: force = Kp * ctrl - Kp * q - Kd * qdot (gainprm[0], biasprm[1:3]).
        position = jnp.asarray(model.actuator_biastype) == 1
        kp = jnp.where(position, _u(next(keys), ranges.gain_scale, (n,)), 1.0)
        kd = jnp.where(position, _u(next(keys), ranges.gain_scale, (n,)), 1.0)
        new["actuator_gainprm"] = gain.at[:, 0].multiply(kp)
        new["actuator_biasprm"] = bias.at[:, 1].multiply(kp).at[:, 2].multiply(kd)
    if ranges.qpos0_offset is not None:
        qpos0 = jnp.asarray(model.qpos0)
        free = jnp.arange(qpos0.shape[0]) < _free_coordinates(model)
        offset = _u(next(keys), ranges.qpos0_offset, qpos0.shape)
        new["qpos0"] = qpos0 + jnp.where(free, 0.0, offset)
    return model.replace(**new)


def _free_coordinates(model: Any) -> int:
    """Leading ``qpos`` entries of a free root joint (7), or 0 without one."""
    joint_types = list(jnp.asarray(model.jnt_type).tolist()) if model.njnt else []
    return 7 if joint_types and joint_types[0] == 0 else 0


def summary(model: Any) -> dict[str, jax.Array]:
    """The drawn values in a few numbers per env (for logging): friction, torso mass and CoM."""
    return {
        "friction_mean": jnp.mean(model.geom_friction[..., 0], axis=-1),
        "torso_mass": model.body_mass[..., 1],
        "torso_com_x": model.body_ipos[..., 1, 0],
    }


__all__ = ["Range", "Ranges", "randomize", "summary"]
