"""``python -m dtq_cli``: the same as the ``dtq`` console script."""

from dtq_cli.console import main

main()
