"""Env ids and their options: the parser and the option tables that every env module shares.

An env is named by a string: a Gymnasium id (``HalfCheetah-v5``) or a JAX env id
(``jax:pendulum``, ``brax:ant``), either followed by options, ``?key=value&key=value``. This
module splits ids (``parse_env_id``, ``split_env_id``, ``is_jax_env``), lists the sim-to-real
options and the values each takes (``OPTIONS``, ``HOST_OPTIONS``, ``option_value``) and checks
an id's options with one kind of message, ``Environment '<id>': option <name>=<value>: <what
to write>`` (``check_values``, ``check_host_options``, ``add_option_wrappers``).

It sits below the env modules (``gym``, ``gym_sim2real``, ``jax_envs``, ``sim2real``, ...): they
import it, and it imports none of them, only ``jaxrl.errors``.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable
from typing import Any

from jaxrl.errors import EnvError

OPTIONS = (
    "decimation",
    "push_speed",
    "action_filter",
    "action_delay",
    "obs_delay",
    "obs_noise",
    "obs_history",
    "privileged",
)
"""Env-id options that add sim-to-real wrappers: ``jax:pendulum?obs_noise=0.05&action_delay=1:3``
(``jaxrl.envs.sim2real`` for JAX envs, ``jaxrl.envs.gym_sim2real`` for Gymnasium envs)."""

HOST_OPTIONS = tuple(name for name in OPTIONS if name != "privileged")
"""Env-id options of host envs: every sim-to-real option but ``privileged`` (JAX envs only)."""


def parse_env_id(env_id: str) -> tuple[str, str, dict[str, Any]]:
    """Split ``'brax:ant?backend=positional&episode_length=500'`` into (kind, name, options).

    Option values are converted to int, float or bool where they look like one; what each
    option accepts is checked later (``check_values``, ``option_value``).

    Raises:
        EnvError: an option is not of the form ``key=value``.
    """
    kind, _, rest = env_id.partition(":")
    name, _, query = rest.partition("?")
    options: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise EnvError(f"Environment {env_id!r}: option {part!r} is not of the form key=value.")
        options[key] = _parse_value(value)
    return kind, name, options


def _parse_value(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def is_jax_env(env_id: str) -> bool:
    """True for ids the fused loop runs (``brax:...`` and ``jax:...``)."""
    return env_id.split(":", 1)[0] in ("brax", "jax") and ":" in env_id


def split_env_id(env_id: str) -> tuple[str, dict[str, Any]]:
    """Split a host id ``'HalfCheetah-v5?obs_noise=0.05&action_delay=1:3'`` into (id, options).

    The id is the part before ``?`` (what ``gym.make`` receives); the options are parsed as
    for JAX env ids (``parse_env_id``) and checked against ``HOST_OPTIONS``
    (``check_host_options``).

    Raises:
        EnvError: an option is malformed, unknown, Brax-only or has an unusable value.
    """
    if "?" not in env_id:
        return env_id, {}
    # parse_env_id splits a 'kind:' prefix first; give it one so that ':' in a Gymnasium id
    # ('module:Env-v0') or in a value ('action_delay=1:3') stays where it is.
    try:
        _, base, options = parse_env_id(f"gym:{env_id}")
    except EnvError as err:
        raise EnvError(str(err).replace(repr(f"gym:{env_id}"), repr(env_id))) from None
    check_host_options(options, env_id)
    return base, options


# ------------------------------------------------------------------ what each option's value is


def steps_range(steps: int | tuple[int, int], name: str) -> tuple[int, int]:
    """``k`` or ``(low, high)`` (inclusive) as a validated range of step counts.

    Raises:
        ValueError: a negative count or ``low > high``; the message starts with ``name``.
    """
    low, high = (steps, steps) if isinstance(steps, numbers.Integral) else tuple(steps)
    if not (0 <= low <= high):
        raise ValueError(
            f"{name}: steps must be k >= 0 or (low, high) with 0 <= low <= high, got {steps!r}."
        )
    return int(low), int(high)


def _count(value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EnvError(f"option {name}={value!r}: use a whole number of steps, e.g. {name}=2.")


def _number(value: Any, name: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise EnvError(f"option {name}={value!r}: use a number, e.g. {name}=0.5.")


def _steps(value: Any, name: str) -> int | tuple[int, int]:
    if isinstance(value, str) and ":" in value:
        low, _, high = value.partition(":")
        try:
            return int(low), int(high)
        except ValueError:
            pass
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EnvError(f"option {name}={value!r}: use a step count k or a range LOW:HIGH.")


def _speeds(value: Any, name: str) -> tuple[float, float]:
    if not isinstance(value, bool):
        text = str(value)
        low, _, high = text.rpartition(":") if ":" in text else ("0", "", text)
        try:
            return float(low), float(high)
        except ValueError:
            pass
    raise EnvError(f"option {name}={value!r}: use LOW:HIGH in m/s, e.g. {name}=0.1:1.")


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise EnvError(f"option {name}={value!r}: use true or false, e.g. {name}=true.")


VALUES: dict[str, Callable[[Any, str], Any]] = {
    "decimation": _count,  # k simulator steps per agent step
    "push_speed": _speeds,  # LOW:HIGH m/s (or HIGH, from 0)
    "action_filter": _number,  # alpha of the low-pass filter
    "action_delay": _steps,  # k or LOW:HIGH steps
    "obs_delay": _steps,
    "obs_noise": _number,  # standard deviation
    "obs_history": _count,  # k observations
    "privileged": _flag,  # true: critic-only features appended (JAX envs)
    "episode_length": _count,  # the time limit of JAX envs, in simulator steps
}
"""Option name -> the converter of its value (what ``parse_env_id`` gives) to what the wrapper
takes; each raises ``EnvError`` naming the option, the value and what to write instead."""


def option_value(name: str, value: Any) -> Any:
    """The value of option ``name`` as its wrapper takes it (``VALUES``); others unchanged.

    Args:
        name: the option, e.g. ``"obs_history"``.
        value: its value as ``parse_env_id`` gives it (``2``, ``"1:3"``, ``True``, ...).

    Raises:
        EnvError: the value has the wrong type, e.g. ``obs_history=2.5`` or ``decimation=true``.
    """
    convert = VALUES.get(name)
    return value if convert is None else convert(value, name)


def check_values(options: dict[str, Any], env_id: str) -> None:
    """Raise ``EnvError`` naming ``env_id`` unless every option in ``VALUES`` has a usable value.

    Args:
        options: an id's options (``parse_env_id``'s values); options not in ``VALUES`` pass.
        env_id: the full id, for the message.
    """
    for name, value in options.items():
        try:
            option_value(name, value)
        except EnvError as err:
            raise EnvError(f"Environment {env_id!r}: {err}") from None


def check_host_options(options: dict[str, Any], env_id: str) -> None:
    """Raise ``EnvError`` unless ``options`` are host env-id options with usable values.

    Args:
        options: the options of ``env_id`` (``parse_env_id``'s values).
        env_id: the full id, for the message.
    """
    if "privileged" in options:
        raise EnvError(
            f"Environment {env_id!r}: privileged=true (critic-only observations) exists for JAX "
            "envs (e.g. 'brax:ant?privileged=true'), which the fused loop trains; drop it from "
            "this Gymnasium id."
        )
    unknown = sorted(set(options) - set(HOST_OPTIONS))
    if unknown:
        close = [c for u in unknown for c in difflib.get_close_matches(u, HOST_OPTIONS, n=1)]
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise EnvError(
            f"Environment {env_id!r}: unknown option(s) {', '.join(unknown)}.{hint} Gymnasium "
            f"env ids take {', '.join(HOST_OPTIONS)}, e.g. "
            "'HalfCheetah-v5?obs_noise=0.05&action_delay=1:3'."
        )
    check_values(options, env_id)


def add_option_wrappers(env: Any, wrappers: Any, options: dict[str, Any], env_id: str = "") -> Any:
    """Wrap ``env`` in the wrappers an id's options ask for, in the order of ``wrappers``.

    Args:
        env: the env to wrap (a JAX env or a Gymnasium env).
        wrappers: ``(option, wrapper class)`` pairs, innermost first; each present option wraps
            the env as ``wrapper(env, option_value(option, value))``.
        options: the id's options as ``parse_env_id`` gives them, e.g. ``{"obs_delay": "2"}``.
        env_id: the full id, for error messages.

    Raises:
        EnvError: a value has the wrong type, or the wrapper refuses it (e.g. ``obs_delay=3:1``,
            ``decimation=0``); the message names the id, the option and the problem.
    """
    where = f"Environment {env_id!r}: " if env_id else ""
    for name, wrapper in wrappers:
        if name not in options:
            continue
        try:
            converted = option_value(name, options[name])
        except EnvError as err:
            raise EnvError(f"{where}{err}") from None
        try:
            env = wrapper(env, converted)
        except ValueError as err:
            raise EnvError(f"{where}option {name}: {err}") from None
    return env


__all__ = [
    "HOST_OPTIONS",
    "OPTIONS",
    "VALUES",
    "add_option_wrappers",
    "check_host_options",
    "check_values",
    "is_jax_env",
    "option_value",
    "parse_env_id",
    "split_env_id",
    "steps_range",
]
