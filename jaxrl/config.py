"""Validation helpers for the frozen config dataclasses of agents and loops."""

from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the accepted range."""


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
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ConfigError(
                    f"{type(config).__name__}.{name} must be positive, got {value!r}; "
                    f"set {_flag(name)} to a value > 0."
                )


def check_range(config: Any, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    """Raise ``ConfigError`` unless ``low <= value <= high`` (``low < value`` if ``low_open``)."""
    value = getattr(config, name)
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


def config_to_dict(config: Any) -> dict[str, Any]:
    """JSON-friendly dict of a (possibly nested) config dataclass."""
    return dataclasses.asdict(config)
