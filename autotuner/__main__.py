"""`python -m autotuner`: the same as the `autotuner` command."""

from autotuner.cli.app import main

main()
