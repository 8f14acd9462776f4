"""The `autotuner` command: the only place where parts are wired together."""

from __future__ import annotations

import typer

from autotuner import __version__

app = typer.Typer(
    name="autotuner",
    help="Closed-loop tuning of vLLM serving flags against runtime CUDA OOM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sim_app = typer.Typer(
    help="A simulated `vllm serve` on GPUs this machine does not have.",
    no_args_is_help=True,
)
app.add_typer(sim_app, name="sim")

# The simulator's commands take vLLM's own command line: argparse parses it, as vLLM does.
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@sim_app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)
def sim_serve(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-gpu G --sim-gpus N --sim-speedup X --sim-seed S]: serve like vLLM."""
    from autotuner.sim.cli import run_serve

    raise typer.Exit(run_serve(ctx.args))


@sim_app.command("evaluate", context_settings=_PASSTHROUGH, add_help_option=False)
def sim_evaluate(ctx: typer.Context) -> None:
    """MODEL [vllm flags] [--sim-*] [workload flags] [--json]: the engine in virtual time."""
    from autotuner.sim.cli import run_evaluate

    raise typer.Exit(run_evaluate(ctx.args))


@app.command()
def version() -> None:
    """Print the autotuner version."""
    typer.echo(__version__)


def main() -> None:
    app()
