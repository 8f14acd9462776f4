"""`autotuner confirm` and `autotuner soak`: the evidence a winner needs before it is exported — the
best candidates measured again, then the confirmed best under the worst workload."""

from __future__ import annotations

from pathlib import Path

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import DEFAULT_STORAGE, configure_logging
from autotuner.errors import UserInputError


def confirm(
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    top: int = typer.Option(3, "--top", help="candidates: the SLO-feasible Pareto front and its neighbours"),
    repeats: int = typer.Option(3, "--repeats", help="engine starts of each candidate, interleaved A B C A B C"),
    replays: int = typer.Option(2, "--replays", help="workload replays per engine start, kept after the first "
                                "round only where the spread is within a start as much as between starts"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Re-measure the best candidates; mean and 95 % interval per objective, worst memory peak."""
    from autotuner.trust.commands import run_confirm  # Optuna and the engine: start-up time

    configure_logging()
    with command_errors():
        raise typer.Exit(run_confirm(storage, study, top, repeats, log_dir, replays))


def soak(
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    set_: list[str] = typer.Option([], "--set", help="NAME=VALUE: soak these flags instead of the confirmed best"),
    duration: str = typer.Option("10m", "--duration", help="how long, in engine time (e.g. 10m)"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    log_dir: Path | None = typer.Option(None, help="engine logs (default: $AUTOTUNER_HOME/logs)"),
) -> None:
    """Run the confirmed best under the worst workload the scenario allows; the next one if it fails."""
    from autotuner.durations import parse_duration
    from autotuner.engine.launch import parse_set  # start-up time, as the imports below
    from autotuner.trust.commands import run_soak

    configure_logging()
    with command_errors():
        seconds = parse_duration(duration) or 0.0
        if seconds <= 0:
            raise UserInputError("--duration must be > 0, e.g. 10m")
        raise typer.Exit(run_soak(storage, study, seconds, parse_set(set_) if set_ else None, log_dir))
