"""``jaxrl train AGENT``: the loop options and the agent's config, parsed with tyro.

``--config FILE.json`` is a tyro option too: the agent settings in the file become the defaults
of the agent's options, so every other option on the command line overrides them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from jaxrl.cli.common import guard, print_summary, usage
from jaxrl.errors import ConfigError

CONFIG_HELP = (
    "agent settings from a JSON file (a run's config.json, a sweep's best_config.json or "
    '{"field": value}); the other options override them'
)


def run(argv: list[str]) -> None:
    """``jaxrl train AGENT [options]``: train and print the summary line."""
    if not argv or argv[0].startswith("-"):
        raise SystemExit(usage())
    train_cfg, agent_cfg = guard(lambda: parse_train_args(argv[0], argv[1:]))
    from jaxrl.run.train import train

    print_summary(guard(lambda: train(argv[0], train_cfg, agent_cfg)))


def parse_train_args(agent_name: str, argv: list[str], defaults: Any = None) -> tuple[Any, Any]:
    """Parse ``jaxrl train AGENT`` options into ``(TrainConfig, agent config)`` with tyro.

    Args:
        agent_name: a registered agent.
        argv: the options after the agent's name.
        defaults: the loop options' defaults (a ``TrainConfig``; scripts set their own).
    """
    spec = agent_spec(agent_name)
    args_cls = train_args_class(spec, config_defaults(spec, argv), defaults)
    description = f"Train {agent_name} online. Resumes when --out holds a checkpoint."
    args = parse_args(args_cls, argv, f"jaxrl train {agent_name}", description)
    return train_configs(args, argv)


def agent_spec(agent_name: str) -> Any:
    """The registry entry of ``agent_name``; an unknown name exits with the list of agents."""
    from jaxrl import registry

    if agent_name not in registry.names():
        raise SystemExit(
            f"Unknown agent {agent_name!r}; choose one of: {', '.join(registry.names())}."
        )
    return registry.get(agent_name)


def train_args_class(
    spec: Any, agent_defaults: Any, defaults: Any = None, extra: tuple = ()
) -> type:
    """The tyro dataclass of ``jaxrl train AGENT``: ``--config``, loop and agent options.

    Args:
        spec: the agent's registry entry.
        agent_defaults: the agent config whose values are the agent options' defaults.
        defaults: the loop options' defaults (default ``TrainConfig()``).
        extra: more ``(name, type, field)`` entries, listed first (``jaxrl sweep``'s options).
    """
    import tyro

    from jaxrl.loops.config import TrainConfig

    omit = tyro.conf.OmitArgPrefixes
    config_arg = tyro.conf.arg(help=CONFIG_HELP, metavar="FILE.json")
    return dataclasses.make_dataclass(
        f"Train{spec.config.__name__}",
        [
            *extra,
            ("config", Annotated[str | None, config_arg], dataclasses.field(default=None)),
            (
                "train",
                Annotated[TrainConfig, omit],
                dataclasses.field(default=defaults or TrainConfig()),
            ),
            ("agent", Annotated[spec.config, omit], dataclasses.field(default=agent_defaults)),
        ],
    )


def parse_args(args_cls: type, argv: list[str], prog: str, description: str) -> Any:
    """``tyro.cli`` on ``argv`` (a bad option exits 2 with the usage)."""
    import tyro

    return tyro.cli(args_cls, args=argv, prog=prog, description=description)


def train_configs(args: Any, argv: list[str]) -> tuple[Any, Any]:
    """``(TrainConfig, agent config)`` of parsed ``train_args_class`` values.

    With ``--dataset`` and no ``--env`` the env is ``""``: the dataset's own (``train``).
    """
    train_cfg = args.train
    env_given = any(a == "--env" or a.startswith("--env=") for a in argv)
    if train_cfg.dataset and not env_given:
        train_cfg = dataclasses.replace(train_cfg, env="")
    return train_cfg, args.agent


def config_defaults(spec: Any, argv: list[str]) -> Any:
    """The agent config that ``--config FILE`` in ``argv`` holds, or the defaults without one.

    The file is JSON: a run's ``config.json`` or a sweep's ``best_config.json`` (the
    ``agent_config`` section), or a plain ``{field: value}`` object.
    """
    import tyro

    config_only = dataclasses.make_dataclass(
        "ConfigFile", [("config", str | None, dataclasses.field(default=None))]
    )
    args = [a for a in argv if a not in ("-h", "--help")]
    found, _ = tyro.cli(config_only, args=args, return_unknown_args=True, add_help=False)
    if found.config is None:
        return spec.config()
    return read_config_file(spec, found.config)


def read_config_file(spec: Any, path: str) -> Any:
    """The agent config held by the JSON file ``path`` (see ``config_defaults``)."""
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
    return spec.make_config(**fields)


__all__ = [
    "agent_spec",
    "config_defaults",
    "parse_train_args",
    "read_config_file",
    "run",
    "train_args_class",
    "train_configs",
]
