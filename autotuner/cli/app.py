"""The `autotuner` command: the typer app, its sub-apps and the table of commands, in the order
`autotuner --help` lists them. The commands live beside it, one module per group; this is the only
place where they are wired together."""

from __future__ import annotations

import typer

from autotuner import __version__
from autotuner.cli.daemon import RUN_EPILOG, daemon_approve, daemon_plan, daemon_reject, daemon_run, daemon_status
from autotuner.cli.fleet import fleet_status
from autotuner.cli.measure import MEASURE_EPILOG, measure
from autotuner.cli.prepare import DOCTOR_EPILOG, INIT_EPILOG, doctor, init, verify
from autotuner.cli.results import export, report, status
from autotuner.cli.simulator import PASSTHROUGH, sim_evaluate, sim_hold, sim_serve
from autotuner.cli.trust import confirm, soak
from autotuner.cli.tune import TUNE_EPILOG, tune
from autotuner.cli.twin import twin

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
daemon_app = typer.Typer(help="Watch production, re-tune when it changes, roll the winner out, roll back on failure.",
                         no_args_is_help=True)
fleet_app = typer.Typer(help="Daemons on several boxes sharing one storage: groups, tunes and rollouts.",
                        no_args_is_help=True)


def version() -> None:
    """Print the autotuner version."""
    typer.echo(__version__)


app.command(epilog=MEASURE_EPILOG, context_settings={"allow_extra_args": True})(measure)
app.command()(verify)
app.command("init", epilog=INIT_EPILOG)(init)
app.command(epilog=TUNE_EPILOG)(tune)
app.command(epilog=DOCTOR_EPILOG)(doctor)
app.command()(confirm)
app.command()(soak)
app.command()(status)
app.command()(export)
app.command()(report)
app.command()(twin)
app.command()(version)

app.add_typer(sim_app, name="sim")
sim_app.command("serve", context_settings=PASSTHROUGH, add_help_option=False)(sim_serve)
sim_app.command("evaluate", context_settings=PASSTHROUGH, add_help_option=False)(sim_evaluate)
sim_app.command("hold", context_settings=PASSTHROUGH, add_help_option=False)(sim_hold)

app.add_typer(daemon_app, name="daemon")
daemon_app.command("run", epilog=RUN_EPILOG)(daemon_run)
daemon_app.command("status")(daemon_status)
daemon_app.command("plan")(daemon_plan)
daemon_app.command("approve")(daemon_approve)
daemon_app.command("reject")(daemon_reject)

app.add_typer(fleet_app, name="fleet")
fleet_app.command("status")(fleet_status)


def main() -> None:
    app()
