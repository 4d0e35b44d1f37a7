"""jaxrl's errors: the problems a user can cause, each naming the problem and the fix.

Every error a user can cause (a bad env id, a dataset with wrong keys, an invalid config value,
an unreadable checkpoint) is a :class:`JaxrlError`. The command line prints such an error as one
line and exits 2; anything else is a bug and keeps its traceback (exit 1). The subclasses also
derive from the builtin exception a caller would expect (``ValueError`` for bad values,
``RuntimeError`` for an unreadable checkpoint), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class JaxrlError(Exception):
    """Base class of every error a user can cause; the message says what to change."""


class ConfigError(JaxrlError, ValueError):
    """A configuration value is invalid; the message names the field and the accepted range."""


class EnvError(JaxrlError, ValueError):
    """An environment id or space is unusable; the message says why and what to use instead."""


class DatasetError(JaxrlError, ValueError):
    """A dataset cannot be used; the message names the problem and how to fix it."""


class CheckpointError(JaxrlError, RuntimeError):
    """A checkpoint could not be read; the message names the directory and how to recover."""


class MissingExtraError(JaxrlError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str) -> object:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``pip install 'jaxrl[extra]'``.

    Args:
        module: The module to import, e.g. ``"optuna"`` or ``"ray.tune"``.
        extra: The jaxrl extra that installs it, e.g. ``"sweep"``.

    Returns:
        The imported module.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingExtraError(
            f"{top} is not installed; it comes with the {extra} extra: "
            f"pip install 'jaxrl[{extra}]'."
        ) from None
