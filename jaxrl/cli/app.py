"""The ``jaxrl`` command line: ``jaxrl COMMAND ...`` dispatches to ``jaxrl.cli.COMMAND``.

Every command parses its options with tyro in its own module (``jaxrl.cli.train``,
``finetune``, ``eval``, ``dataset``, ``sweep``, ``plot``, ``plan``, ``export``), each with a
``run(argv)``. ``jaxrl --help`` imports none of them. ``jaxrl train AGENT --help`` lists every
loop option and agent hyperparameter with its docstring.
"""

from __future__ import annotations

import importlib
import sys

from jaxrl.cli.common import EXIT_DIVERGED, EXIT_STOPPED, usage
from jaxrl.cli.train import parse_train_args

COMMANDS = ("train", "finetune", "eval", "dataset", "sweep", "plot", "plan", "export")
"""The commands; ``jaxrl COMMAND`` runs ``jaxrl.cli.COMMAND.run(argv)``."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jaxrl`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        raise SystemExit(f"Unknown command {cmd!r}.\n{usage()}")
    importlib.import_module(f"jaxrl.cli.{cmd}").run(rest)


__all__ = [
    "COMMANDS",
    "EXIT_DIVERGED",
    "EXIT_STOPPED",
    "main",
    "parse_train_args",
    "usage",
]


if __name__ == "__main__":
    main()
