"""`python -m autotuner.sim serve|evaluate …`: the simulator without the full CLI's imports."""

import sys

from autotuner.sim.cli import run_evaluate, run_hold, run_serve

_COMMANDS = {"serve": run_serve, "evaluate": run_evaluate, "hold": run_hold}

if len(sys.argv) < 2 or sys.argv[1] not in _COMMANDS:
    print("usage: python -m autotuner.sim {serve,evaluate,hold} MODEL [flags]", file=sys.stderr)
    sys.exit(2)
sys.exit(_COMMANDS[sys.argv[1]](sys.argv[2:]))
