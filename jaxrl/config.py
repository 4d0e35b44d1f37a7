"""The fields every agent of a kind shares, and validation helpers for config dataclasses.

An agent's config inherits one typed group and adds only its own fields:

- ``OffPolicyFields``: discount, target-network tau, minibatch size, update-to-data ratio,
  replay capacity and warm-up, shared by every agent that learns from a replay buffer;
- ``OfflineFields``: those, plus the dataset-statistics normalization of offline agents.

An agent whose paper uses another value redeclares the field with its own default, without a
docstring: the group's docstring stays the one ``--help`` shows. Each group validates its fields
once in ``__post_init__``; an agent's ``__post_init__`` calls ``super().__post_init__()`` first.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, get_args

from jaxrl.errors import ConfigError

RewardNormalization = Literal["none", "return_range"]
"""How an offline agent scales rewards: not at all, or by episode length / episode-return range."""

REWARD_NORMALIZATIONS: tuple[str, ...] = get_args(RewardNormalization)
"""Accepted values of ``OfflineFields.reward_normalization``."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_positive(config: Any, *names: str) -> None:
    """Raise ``ConfigError`` unless every named field is > 0 (tuples: every element)."""
    for name in names:
        value = getattr(config, name)
        values = value if isinstance(value, tuple | list) else (value,)
        if isinstance(value, tuple | list) and not value:
            raise ConfigError(f"{name} must not be empty; pass e.g. {_flag(name)} 256 256.")
        for v in values:
            if v is None:
                continue
            # NaN passes ``v <= 0`` and inf is no rate or size: both are refused here.
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ConfigError(
                    f"{type(config).__name__}.{name} must be positive, got {value!r}; "
                    f"set {_flag(name)} to a value > 0."
                )
            if not math.isfinite(v):
                raise ConfigError(
                    f"{type(config).__name__}.{name} must be finite, got {value!r}; "
                    f"set {_flag(name)} to a finite value > 0."
                )


def check_range(config: Any, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    """Raise ``ConfigError`` unless ``low <= value <= high`` (``low < value`` if ``low_open``).

    The value must also be finite (NaN, and inf even when ``high`` is inf, are refused).
    """
    value = getattr(config, name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{type(config).__name__}.{name} must be finite, got {value!r}; set {_flag(name)} "
            "to a finite value."
        )
    ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ConfigError(
            f"{type(config).__name__}.{name} must be in {bracket}{low}, {high}], got {value!r}; "
            f"set {_flag(name)} accordingly."
        )


def check_choice(config: Any, name: str, choices: Any) -> None:
    """Raise ``ConfigError`` unless the named field is one of ``choices``."""
    value = getattr(config, name)
    if value not in choices:
        raise ConfigError(
            f"{type(config).__name__}.{name} must be one of {tuple(choices)}, got {value!r}; "
            f"set {_flag(name)} accordingly."
        )


def check_new_field(config_cls: type, name: str, seen: Any, where: str, fix: str) -> None:
    """Refuse ``name`` when ``config_cls`` has no such field or it is already in ``seen``.

    For lists of ``FIELD=...`` specs (grids, searches): ``where`` starts the message (e.g.
    ``"--grid"``), ``fix`` ends the one about a repeated field.

    Raises:
        ConfigError: an unknown field (the known ones are listed) or a repeated one.
    """
    fields = [f.name for f in dataclasses.fields(config_cls)]
    if name not in fields:
        raise ConfigError(
            f"{where}: {config_cls.__name__} has no field {name!r}; known fields: "
            f"{', '.join(fields)}."
        )
    if name in seen:
        raise ConfigError(f"{where}: {name!r} is given twice; {fix}.")


def config_to_dict(config: Any) -> dict[str, Any]:
    """JSON-friendly dict of a (possibly nested) config dataclass."""
    return dataclasses.asdict(config)


# ------------------------------------------------------------------------------ shared groups


@dataclasses.dataclass(frozen=True, kw_only=True)
class OffPolicyFields:
    """Fields of every agent that learns from a replay buffer (the off-policy and offline kinds).

    The defaults are the common MuJoCo settings; an agent redeclares a field where its paper
    differs (e.g. SAC's warm-up of 5,000 steps).
    """

    discount: float = 0.99
    """Discount factor gamma."""
    tau: float = 0.005
    """Polyak averaging coefficient of the target networks."""
    batch_size: int = 256
    """Minibatch size of each gradient step."""
    utd_ratio: int = 1
    """Gradient steps per environment step (update-to-data ratio; offline: when fine-tuning)."""
    buffer_size: int = 10**6
    """Replay buffer capacity in transitions."""
    learning_starts: int = 0
    """Environment steps with uniformly random actions and no updates before learning starts."""

    def __post_init__(self) -> None:
        check_positive(self, "batch_size", "utd_ratio", "buffer_size")
        if self.discount is not None:  # None: an agent's env-derived discount, set at run setup
            check_range(self, "discount", 0.0, 1.0)
        check_range(self, "tau", 0.0, 1.0, low_open=True)
        check_range(self, "learning_starts", 0, float("inf"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class OfflineFields(OffPolicyFields):
    """``OffPolicyFields`` plus the dataset statistics an offline agent applies to its inputs.

    The agent itself normalizes (``jaxrl.offline.common.DataNorm``), so raw observations and
    rewards flow through buffers, evaluation and fine-tuning. ``utd_ratio`` and
    ``learning_starts`` apply to online fine-tuning.
    """

    normalize_observations: bool = False
    """Standardize observations with the dataset's mean and std (inside the agent)."""
    reward_normalization: RewardNormalization = "none"
    """Reward scaling from the data: 'none', or 'return_range' (episode length / return spread)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self, "reward_normalization", REWARD_NORMALIZATIONS)
