"""The ``jaxrl`` command: argument parsing and one module per command.

``main`` dispatches ``jaxrl COMMAND ...``; the commands call the run layer (``jaxrl.run``), the
tuners (``jaxrl.tune``), the exporter (``jaxrl.export``) and the plots (``jaxrl.analysis``).
Nothing below imports this package.
"""

from jaxrl.cli.app import EXIT_DIVERGED, EXIT_STOPPED, main, parse_train_args

__all__ = ["EXIT_DIVERGED", "EXIT_STOPPED", "main", "parse_train_args"]
