"""Planning a sweep: the grid, its settings, and the programs they train in (``jaxrl sweep``).

``parse_grid`` reads ``--grid FIELD=V1,V2`` against the agent's config, ``settings`` lists every
combination, and ``plan`` groups settings x seeds into ``Program``s of ``Member``s: one program
per combination of the static fields' values (``jaxrl.run.fields`` classifies each field as
leaf or static), so that each program trains as one vmapped program. Running them is
``jaxrl.tune.grid``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import types
import typing
from typing import Any

from jaxrl.config import ConfigError, check_new_field
from jaxrl.registry import AgentSpec
from jaxrl.run.fields import format_value


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a sweep: a setting of the swept fields and a seed.

    Attributes:
        setting: the swept fields' values of this member.
        seed: its seed.
        config: its full agent config.
        out: its run directory.
    """

    setting: dict[str, Any]
    seed: int
    config: Any
    out: str

    @property
    def label(self) -> str:
        """``field=value,...`` of the setting (the run directory's parent name)."""
        return setting_label(self.setting)


def setting_label(setting: dict[str, Any]) -> str:
    """``actor_lr=0.0001,tau=0.005``: a setting as a directory name (``base`` when empty)."""
    return ",".join(f"{k}={format_value(v)}" for k, v in setting.items()) or "base"


# ------------------------------------------------------------------------------ the grid


def _field_type(config_cls: type, name: str) -> Any:
    return typing.get_type_hints(config_cls)[name]


def _parse_value(text: str, hint: Any, name: str) -> Any:
    """A grid value of field ``name`` with type ``hint`` (``float | None`` accepts ``none``)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)][:1] or (str,)
        args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if hint is int:
            value = float(text)
            if value != int(value):
                raise ValueError(text)
            return int(value)
        if hint is float:
            return float(text)
        if origin is tuple:
            return tuple(_parse_value(t, args[0], name) for t in text.split(":"))
        if origin is typing.Literal and text not in args:
            raise ValueError(text)
    except ValueError:
        raise ConfigError(
            f"--grid {name}: cannot read {text!r} as {getattr(hint, '__name__', hint)}"
            f"{' (tuples: 256:256)' if origin is tuple else ''}."
        ) from None
    return text


def parse_grid(specs: list[str], config_cls: type) -> dict[str, tuple]:
    """``["actor_lr=1e-4,3e-4", "tau=0.005"]`` -> ``{"actor_lr": (1e-4, 3e-4), "tau": (0.005,)}``.

    Raises:
        ConfigError: a spec without ``=``, an unknown field (the known ones are listed), an
            empty list, a repeated field or value, or a value of the wrong type.
    """
    grid: dict[str, tuple] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise ConfigError(f"--grid {spec!r}: write FIELD=V1,V2,... (e.g. actor_lr=1e-4,3e-4).")
        check_new_field(config_cls, name, grid, "--grid", "list all its values in one --grid")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not items:
            raise ConfigError(f"--grid {name}= has no values; write e.g. {name}=V1,V2.")
        hint = _field_type(config_cls, name)
        grid[name] = tuple(_parse_value(v, hint, name) for v in items)
        if len(set(map(repr, grid[name]))) < len(grid[name]):
            raise ConfigError(
                f"--grid {name}={values}: a value is repeated (the same setting would train "
                "twice); list each value once, and use --seeds for repeats."
            )
    return grid


def settings(grid: dict[str, tuple]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the order given (the last field fastest)."""
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


# ------------------------------------------------------------------------- the programs


@dataclasses.dataclass(frozen=True)
class Program:
    """Members that train as one vmapped program: they agree on every static field."""

    config: Any
    static: dict[str, Any]
    members: list[Member]


def plan(
    spec: AgentSpec,
    base: Any,
    grid: dict[str, tuple],
    kinds: dict[str, str],
    seeds: list[int],
    out_root: str,
    *,
    split: bool = True,
) -> list[Program]:
    """Group the grid x seeds into programs, one per combination of the static fields' values.

    Raises:
        ConfigError: ``split=False`` and a swept field with several values is static.
    """
    static = [k for k, v in kinds.items() if v == "static" and len(grid[k]) > 1]
    if static and not split:
        raise ConfigError(
            f"--grid {', '.join(static)}: static field(s) (shapes or read outside the "
            "agent's leaves) cannot vary inside one vmapped program; drop --no-split to run one "
            "program per value, or sweep them in separate runs."
        )
    programs: dict[tuple, Program] = {}
    for setting in settings(grid):
        fixed = {k: setting[k] for k in kinds if kinds[k] == "static"}
        key = tuple(fixed.items())
        if key not in programs:
            programs[key] = Program(dataclasses.replace(base, **fixed), fixed, [])
        config = dataclasses.replace(base, **setting)
        for seed in seeds:
            out = os.path.join(out_root, setting_label(setting), f"s{seed}")
            programs[key].members.append(Member(setting, seed, config, out))
    return list(programs.values())


__all__ = ["Member", "Program", "parse_grid", "plan", "setting_label", "settings"]
