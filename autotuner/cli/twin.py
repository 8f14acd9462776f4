"""`autotuner twin STUDY`: what the study's calibrated twin says of this box (autotuner.twin.report)."""

from __future__ import annotations

import json

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import DEFAULT_STORAGE


def twin(
    study: str = typer.Argument(..., help="a study (`autotuner status` lists them)"),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="SQLite path or SQLAlchemy URL"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable"),
) -> None:
    """The study's twin: its calibrated box parameters with 95 % intervals, its prediction against every
    measured trial, and its error (a few seconds of CPU: the calibration is recomputed from the trials)."""
    from autotuner.analysis.study_data import open_store  # start-up time
    from autotuner.tuner.runners import VirtualRunner
    from autotuner.twin.report import render, twin_report

    with command_errors(storage_url=storage):
        report = twin_report(open_store(storage), study, VirtualRunner)
        if as_json:
            typer.echo(json.dumps(report.as_dict(), indent=2))
        else:
            for line in render(report):
                typer.echo(line)
