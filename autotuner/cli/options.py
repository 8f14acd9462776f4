"""What several commands share: the default storage, the `--log-format` option and what it switches
on (the console or JSON log, and the run's log file), and the preflight's warnings on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from autotuner.scenario import Scenario
    from autotuner.vllm import FlagValue

DEFAULT_STORAGE = "sqlite:///autotuner.db"
LOG_FORMAT_HELP = ("auto: on a terminal a live view and warnings only, piped JSON lines; console; json "
                   "(every event as JSON lines on stderr). The full log is always in $AUTOTUNER_HOME/logs/NAME.jsonl")

# The machinery behind the commands is imported where it is used: pydantic, SQLAlchemy, structlog,
# httpx and Optuna cost seconds, which `autotuner --help`, `version` and every bad-input exit would pay.


def configure_logging(log_format: str = "auto", quiet: bool = False) -> None:
    from autotuner.logs import configure  # structlog: start-up time

    if log_format not in ("auto", "console", "json"):
        typer.echo(f"error: --log-format {log_format}: use auto, console or json", err=True)
        raise typer.Exit(2)
    configure(log_format=log_format, quiet=quiet)  # type: ignore[arg-type]


def log_to_file(name: str, quiet: bool) -> None:
    """Every event of this run, as JSON lines, in $AUTOTUNER_HOME/logs/NAME.jsonl; its path is said first."""
    from autotuner.engine.registry import autotuner_home  # psutil: start-up time
    from autotuner.logs import attach_file, log_file_for  # structlog: start-up time

    path = attach_file(log_file_for(autotuner_home(), name))
    if path is not None and not quiet:
        typer.echo(f"log: {path}", err=True)


def default_log_dir(scenario: Scenario, log_dir: Path | None) -> Path:
    """Where a run's engine logs go: --log-dir, else $AUTOTUNER_HOME/logs/SCENARIO."""
    from autotuner.engine.registry import autotuner_home  # psutil: start-up time

    return log_dir or autotuner_home() / "logs" / scenario.name


def warn_preflight(scenario: Scenario, storage: str | None, log_dir: Path | None,
                   overrides: dict[str, FlagValue] | None = None) -> None:
    """Checks before anything is launched or written: failures raise PreflightError (exit 2),
    warnings go to stderr."""
    from autotuner.preflight import preflight  # the scenario's checks: start-up time

    report = preflight(scenario, storage=storage, log_dir=log_dir, overrides=overrides)
    for check in report.warnings:
        typer.echo(f"warning: {check.line()}", err=True)
