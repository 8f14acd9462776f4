"""`autotuner status`, `export` and `report`: what a stored study holds, read back — at a glance on
the terminal, as a deployment artefact with its certificate, or as a report."""

from __future__ import annotations

from pathlib import Path

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import DEFAULT_STORAGE
from autotuner.errors import UserInputError


def status(
    study: str | None = typer.Argument(None, help="a study: list its trials"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    watch: bool = typer.Option(False, "--watch", "-w", help="follow a running study (STUDY required): the "
                               "live table of `tune`, refreshed from the database until Ctrl-C"),
    interval: float = typer.Option(2.0, "--interval", help="seconds between refreshes with --watch"),
    trial: int | None = typer.Option(None, "--trial", help="one trial of STUDY in full (its whole reason)"),
) -> None:
    """Studies in the storage and their trials; --watch follows a running study from another terminal."""
    from autotuner.view.study_status import run_status  # the study's analysis: start-up time

    with command_errors():
        if watch:
            raise typer.Exit(watch_status(storage, study, interval))
        raise typer.Exit(run_status(storage, study, trial=trial))


def watch_status(storage: str, study: str | None, interval: float) -> int:
    from autotuner.view.study_status import watch  # the study's analysis: start-up time

    if study is None:
        raise UserInputError("status --watch needs a study: autotuner status STUDY --watch")
    if not interval > 0:
        raise UserInputError(f"--interval {interval}: must be a positive number of seconds")
    try:
        return watch(storage, study, interval_s=interval)
    except KeyboardInterrupt:
        return 0


def export(
    fmt: str = typer.Option(..., "--format", help="cmd | yaml | compose | systemd | env | json | "
                            "helm-values | kserve | k8s-args | ray-serve"),
    output: Path | None = typer.Option(None, "-o", "--output", help="file to write (default: stdout), created "
                                       "0600; an existing one is replaced only with --force and keeps its mode "
                                       "where stricter; a symlink is followed and its target replaced"),
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    slo: list[str] = typer.Option([], "--slo", help="e.g. 'ttft_p95<=2s' (repeatable; on top of the "
                                  "scenario's SLOs)"),
    policy: str = typer.Option("knee", "--policy", help="max-throughput | min-ttft | knee"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    force: bool = typer.Option(False, "--force", help="replace an existing -o file; export even if this "
                               "machine's GPUs or the model differ from the study's"),
    allow_unverified: bool = typer.Option(False, "--allow-unverified", help="export a winner that was not "
                                          "confirmed and soaked (the certificate says so)"),
) -> None:
    """Export the chosen Pareto config as a deployment artefact, with its certificate."""
    from autotuner.export.exporter import run_export  # the study's analysis: start-up time

    with command_errors():
        raise typer.Exit(run_export(storage, study, slo, policy, fmt, output, force, allow_unverified))


def report(
    output: Path = typer.Option(..., "-o", "--output", help="directory for report.md, report.html, PNGs"),
    study: str | None = typer.Option(None, "--study", help="study name (default: the only/newest one)"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
) -> None:
    """Markdown and HTML report: Pareto front, trials, baseline against winner, memory timeline."""
    from autotuner.export.report import run_report  # the study's analysis: start-up time

    with command_errors():
        raise typer.Exit(run_report(storage, study, output))
