"""``jaxrl train AGENT``: the loop options and the agent's config, parsed with tyro."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from jaxrl.errors import ConfigError


def parse_train_args(agent_name: str, argv: list[str], defaults: Any = None) -> tuple[Any, Any]:
    """Parse ``jaxrl train AGENT`` options into ``(TrainConfig, agent config)`` with tyro.

    Args:
        agent_name: a registered agent.
        argv: the options after the agent's name.
        defaults: the loop options' defaults (a ``TrainConfig``; scripts set their own).
    """
    import tyro

    from jaxrl import registry
    from jaxrl.loops.config import TrainConfig

    if agent_name not in registry.names():
        raise SystemExit(
            f"Unknown agent {agent_name!r}; choose one of: {', '.join(registry.names())}."
        )
    spec = registry.get(agent_name)
    config_cls = spec.config
    argv, agent_defaults = _config_file(spec, argv)
    defaults = defaults or TrainConfig()
    omit = tyro.conf.OmitArgPrefixes
    args_cls = dataclasses.make_dataclass(
        f"Train{config_cls.__name__}",
        [
            ("train", Annotated[TrainConfig, omit], dataclasses.field(default=defaults)),
            ("agent", Annotated[config_cls, omit], dataclasses.field(default=agent_defaults)),
        ],
    )
    args = tyro.cli(
        args_cls,
        args=argv,
        prog=f"jaxrl train {agent_name}",
        description=f"Train {agent_name} online. Resumes when --out holds a checkpoint.",
    )
    train_cfg = args.train
    env_given = any(a == "--env" or a.startswith("--env=") for a in argv)
    if train_cfg.dataset and not env_given:
        train_cfg = dataclasses.replace(train_cfg, env="")  # "": the dataset's env (train())
    return train_cfg, args.agent


def _config_file(spec: Any, argv: list[str]) -> tuple[list[str], Any]:
    """``argv`` without ``--config FILE``, and the agent config that file holds (or defaults).

    The file is JSON: a run's ``config.json`` or a sweep's ``best_config.json`` (the
    ``agent_config`` section), or a plain ``{field: value}`` object.
    """
    argv = list(argv)
    path = None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
            del argv[i : i + 2]
            break
        if a.startswith("--config="):
            path = a.split("=", 1)[1]
            del argv[i]
            break
    if path is None:
        return argv, spec.config()
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot read it as JSON ({e}).") from None
    if not isinstance(data, dict) or not isinstance(data.get("agent_config", {}), dict):
        raise ConfigError(
            f"--config {path} must hold a JSON object: a run's config.json, a sweep's "
            'best_config.json or {"field": value, ...}.'
        )
    if data.get("agent") not in (None, spec.name):
        raise ConfigError(
            f"--config {path} holds settings of {data['agent']!r}, not {spec.name!r}; use "
            f"`jaxrl train {data['agent']} --config {path}`."
        )
    fields = data.get("agent_config", data)
    known = {f.name for f in dataclasses.fields(spec.config)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(
            f"--config {path}: {spec.config.__name__} has no field(s) {', '.join(unknown)}."
        )
    return argv, spec.make_config(**fields)
