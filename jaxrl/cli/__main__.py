"""``python -m jaxrl.cli ...``: the ``jaxrl`` command without the console script."""

from jaxrl.cli import main

main()
