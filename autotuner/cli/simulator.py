"""`autotuner sim serve | evaluate | hold`: the simulator's commands. They take vLLM's own command line,
which the simulator parses with argparse as vLLM does; typer passes it through untouched."""

from __future__ import annotations

import typer

PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def sim_serve(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-gpu G --sim-gpus N --sim-speedup X --sim-seed S]: serve like vLLM."""
    from autotuner.sim.cli import run_serve  # the simulator: start-up time

    raise typer.Exit(run_serve(ctx.args))


def sim_evaluate(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-*] [workload flags] [--json]: the engine in virtual time."""
    from autotuner.sim.cli import run_evaluate  # the simulator: start-up time

    raise typer.Exit(run_evaluate(ctx.args))


def sim_hold(ctx: typer.Context) -> None:
    """--gpu I --mib N [--unlisted]: hold simulated GPU memory as a foreign process until killed."""
    from autotuner.sim.cli import run_hold  # the simulator: start-up time

    raise typer.Exit(run_hold(ctx.args))
