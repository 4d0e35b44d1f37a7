"""Domain randomization of Brax (MJX) physics, drawn again at every episode reset.

Brax and MuJoCo Playground draw randomized models once per env slot, when the wrapper is built;
auto-reset then restores a cached first state with the same model. Here the model is part of
each env's simulator state (``BraxCore(..., randomize=Ranges())``): every reset, including the
auto-resets inside the fused loop's compiled program, calls ``randomize(model, key)`` with a
fresh key, so consecutive episodes of one env slot run on different physics without
recompiling, and the drawn values are in the env state (checkpointed with it).

Backends. MJX reads the MuJoCo model fields; Brax's ``generalized``, ``positional`` and
``spring`` pipelines read their own copies, which ``randomize`` writes too (``_brax_copies``):

| parameter | mjx | generalized | positional, spring |
|---|---|---|---|
| friction | ``geom_friction`` | contacts (``geom_friction``) | contacts (``geom_friction``) |
| masses, torso mass | ``body_mass`` | ``link.inertia.mass`` | ``link.inertia.mass`` |
| torso CoM | ``body_ipos`` | ``link.inertia.transform.pos`` | same |
| armature | ``dof_armature`` | ``dof.armature`` | not read (refused) |
| damping | ``dof_damping`` | ``dof.damping`` | not read (refused) |
| Kp/Kd, motor strength | ``actuator_gainprm/biasprm`` | ``actuator.gain/bias_q/bias_qd`` | same |
| qpos0 | ``qpos0`` and ``init_q`` | ``init_q`` (and ``qpos0``) | same |

The reset pose of Brax's envs is ``sys.init_q``, so a ``qpos0`` offset moves it on every backend.
``BACKEND_UNSUPPORTED`` lists what a backend does not read; ``check_backend`` refuses it.

Default ranges are those MuJoCo Playground's Go1 joystick task uses, applied to any model:
friction ``U(0.4, 1.0)``, link masses ``x U(0.9, 1.1)``, torso mass ``+ U(-1, 1)`` kg, torso
centre of mass ``+ U(-0.05, 0.05)`` m per axis, armature ``x U(1, 1.05)``, and the gains of
position actuators (Kp, Kd) ``x U(0.9, 1.1)``; motors, which have no such gains (Ant,
HalfCheetah), keep theirs. ``qpos0`` offsets, damping scales and the strength of motors
(``motor_strength``) are available and off by default.

Ranges can be stated in the env id: every field of ``Ranges`` is an option with the value
``LOW:HIGH`` (a uniform draw), ``K`` (the fixed value ``K:K``) or ``none`` (not randomized),
overriding the default of that field, e.g.
``brax:inverted_pendulum?mass_scale=0.5:2&motor_strength=0.7:1.3&friction=none``. Such an option
turns randomization on without ``randomize=true`` (see ``ranges_from_options``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.errors import EnvError

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
        motor_strength: factor on the gain of every motor actuator (no bias, MuJoCo
            ``biastype`` none: force = gain x gear x ctrl), drawn independently per actuator.
            Position actuators are scaled by ``gain_scale`` instead. Off by default, as in
            Playground's Go1 ranges (its actuators are position servos).
    """

    friction: Range = (0.4, 1.0)
    mass_scale: Range = (0.9, 1.1)
    torso_mass_add: Range = (-1.0, 1.0)
    com_offset: Range = (-0.05, 0.05)
    armature_scale: Range = (1.0, 1.05)
    damping_scale: Range = None
    gain_scale: Range = (0.9, 1.1)
    qpos0_offset: Range = None
    motor_strength: Range = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            r = getattr(self, f.name)
            if r is not None and not (len(r) == 2 and r[0] <= r[1]):
                raise ValueError(f"Ranges.{f.name} must be (low, high) with low <= high, got {r}.")
            if r is not None and f.name in _NONNEGATIVE and r[0] < 0:
                raise ValueError(
                    f"Ranges.{f.name} is a factor or a friction and must be >= 0, got {r}; "
                    f"state a range such as (0.5, 1.5)."
                )


_NONNEGATIVE = (
    "friction",
    "mass_scale",
    "armature_scale",
    "damping_scale",
    "gain_scale",
    "motor_strength",
)
"""Fields whose values multiply a physical quantity (or are one) that must stay >= 0."""


MODEL_FIELDS = (
    "geom_friction",
    "body_mass",
    "body_ipos",
    "dof_armature",
    "dof_damping",
    "actuator_gainprm",
    "actuator_biasprm",
    "qpos0",
)
"""The MuJoCo model fields ``randomize`` may draw (a renderer copies them into its model)."""


def field_names() -> tuple[str, ...]:
    """The names of ``Ranges``' fields, which are also env-id options."""
    return tuple(f.name for f in dataclasses.fields(Ranges))


def _parse_range(name: str, value: Any, env_id: str) -> Range:
    """An env-id option value (``LOW:HIGH``, ``K`` or ``none``) as a range."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int | float):
            low = high = float(value)
        else:
            low_text, colon, high_text = str(value).partition(":")
            if not colon:
                raise ValueError
            low, high = float(low_text), float(high_text)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError
    except ValueError:
        raise EnvError(
            f"Environment {env_id!r}: {name}={value} is not a range; write {name}=LOW:HIGH "
            f"(e.g. {name}=0.5:1.5), {name}=K for a fixed value, or {name}=none to switch it off."
        ) from None
    return (low, high)


def ranges_from_options(options: dict[str, Any], env_id: str = "") -> Ranges | None:
    """Take ``randomize`` and the ``Ranges`` fields out of an env id's ``options``.

    ``randomize=true`` starts from the default ``Ranges()``; each field stated as an option
    (``mass_scale=0.5:2``, ``friction=none``) replaces that field's default, and stating one
    turns randomization on by itself. The options used are removed from ``options``.

    Args:
        options: the parsed options of the id (``parse_env_id``); modified in place.
        env_id: the id, for error messages.

    Returns:
        The ranges, or None when the id asks for no randomization.

    Raises:
        EnvError: ``randomize`` is not true/false, a range is malformed or invalid (low > high,
            a negative factor), or ``randomize=false`` is combined with stated ranges.
    """
    switch = options.pop("randomize", None)
    if switch is not None and not isinstance(switch, bool):
        raise EnvError(
            f"Environment {env_id!r}: randomize={switch} must be true or false "
            "(e.g. randomize=true for the default ranges)."
        )
    stated = {
        name: _parse_range(name, options.pop(name), env_id)
        for name in field_names()
        if name in options
    }
    if switch is False and stated:
        raise EnvError(
            f"Environment {env_id!r}: randomize=false, yet ranges are stated "
            f"({', '.join(stated)}); drop randomize=false to randomize with them, or drop them."
        )
    if not switch and not stated:
        return None
    try:
        return Ranges(**stated)
    except ValueError as err:
        raise EnvError(f"Environment {env_id!r}: {err}") from None


def close_field(option: str) -> str | None:
    """The ``Ranges`` field an unknown option was probably meant to be, if any (a hint)."""
    close = difflib.get_close_matches(option, field_names(), n=1, cutoff=0.75)
    return close[0] if close else None


def _u(key: jax.Array, r: tuple[float, float], shape: tuple[int, ...]) -> jax.Array:
    return jax.random.uniform(key, shape, jnp.float32, r[0], r[1])


BACKEND_UNSUPPORTED = {
    "mjx": (),
    "generalized": (),
    "positional": ("armature_scale", "damping_scale"),
    "spring": ("armature_scale", "damping_scale"),
}
"""The ``Ranges`` fields each Brax backend's pipeline does not read."""


def check_backend(ranges: Ranges, backend: str, env_name: str = "NAME") -> None:
    """Refuse ``ranges`` that set a parameter ``backend`` does not simulate.

    Raises:
        ValueError: naming the fields, the backends that read them, and how to switch them off.
    """
    bad = [f for f in BACKEND_UNSUPPORTED.get(backend, ()) if getattr(ranges, f) is not None]
    if backend not in BACKEND_UNSUPPORTED:
        raise ValueError(f"Domain randomization: unknown Brax backend {backend!r}.")
    if bad:
        off = "&".join(f"{f}=none" for f in bad)
        raise ValueError(
            f"Domain randomization: the {backend} backend does not simulate "
            f"{', '.join(bad)} (only mjx and generalized read them); use "
            f"brax:{env_name}?backend={backend}&randomize=true&{off}, or backend=mjx."
        )


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
    gain = jnp.asarray(model.actuator_gainprm)
    n = gain.shape[0]
    if ranges.gain_scale is not None:
        bias = jnp.asarray(model.actuator_biasprm)
        # Position actuators: force = Kp * ctrl - Kp * q - Kd * qdot (gainprm[0], biasprm[1:3]).
        position = jnp.asarray(model.actuator_biastype) == 1
        kp = jnp.where(position, _u(next(keys), ranges.gain_scale, (n,)), 1.0)
        kd = jnp.where(position, _u(next(keys), ranges.gain_scale, (n,)), 1.0)
        gain = gain.at[:, 0].multiply(kp)
        new["actuator_gainprm"] = gain
        new["actuator_biasprm"] = bias.at[:, 1].multiply(kp).at[:, 2].multiply(kd)
    if ranges.motor_strength is not None:
        # Motors (biastype none): force = gainprm[0] * gear * ctrl. A key of its own, so the
        # other fields draw what they drew before this field existed.
        motor = jnp.asarray(model.actuator_biastype) == 0
        k_motor = jax.random.fold_in(key, 1_000_003)
        strength = jnp.where(motor, _u(k_motor, ranges.motor_strength, (n,)), 1.0)
        new["actuator_gainprm"] = gain.at[:, 0].multiply(strength)
    if ranges.qpos0_offset is not None:
        qpos0 = jnp.asarray(model.qpos0)
        free = jnp.arange(qpos0.shape[0]) < _free_coordinates(model)
        offset = _u(next(keys), ranges.qpos0_offset, qpos0.shape)
        new["qpos0"] = qpos0 + jnp.where(free, 0.0, offset)
    return model.replace(**new, **_brax_copies(model, new))


def _brax_copies(model: Any, new: dict[str, Any]) -> dict[str, Any]:
    """Brax's own copies of the MuJoCo fields in ``new`` (what its non-MJX pipelines read).

    ``link`` holds the bodies after the world body, ``dof`` the joints' dofs, ``actuator`` the
    joint actuators (``bias_q``/``bias_qd`` are zero for motors), ``init_q`` the reset pose.
    A plain MJX model (no Brax ``System``) has none of them.
    """
    if not hasattr(model, "link"):
        return {}
    out: dict[str, Any] = {}
    link = model.link
    if "body_mass" in new:
        link = link.replace(inertia=link.inertia.replace(mass=new["body_mass"][1:]))
    if "body_ipos" in new:
        frame = link.inertia.transform.replace(pos=new["body_ipos"][1:])
        link = link.replace(inertia=link.inertia.replace(transform=frame))
    out["link"] = link
    dof = model.dof
    if "dof_armature" in new:
        dof = dof.replace(armature=new["dof_armature"])
    if "dof_damping" in new:
        dof = dof.replace(damping=new["dof_damping"])
    out["dof"] = dof
    act = model.actuator
    if act.gain.shape[0] == new.get("actuator_gainprm", model.actuator_gainprm).shape[0]:
        if "actuator_gainprm" in new:
            act = act.replace(gain=new["actuator_gainprm"][:, 0])
        if "actuator_biasprm" in new:
            servo = jnp.asarray(model.actuator_biastype) != 0
            bias = new["actuator_biasprm"]
            act = act.replace(bias_q=bias[:, 1] * servo, bias_qd=bias[:, 2] * servo)
    out["actuator"] = act
    if "qpos0" in new:
        out["init_q"] = jnp.asarray(model.init_q) + new["qpos0"] - jnp.asarray(model.qpos0)
    return out


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


__all__ = [
    "BACKEND_UNSUPPORTED",
    "MODEL_FIELDS",
    "Range",
    "Ranges",
    "check_backend",
    "close_field",
    "field_names",
    "randomize",
    "ranges_from_options",
    "summary",
]
