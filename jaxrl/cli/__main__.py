"""``python -m jaxrl.cli``: the ``jaxrl`` command."""

from jaxrl.cli.app import main

if __name__ == "__main__":
    main()
