"""The `autotuner` command line, one module per group of commands; `app` wires them together."""
