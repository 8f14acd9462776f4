"""The commands' one error wrapper: which failures become `error: ...` and which exit code."""

from __future__ import annotations

import sqlite3

import pytest
import typer

from autotuner.cli.exits import command_errors
from autotuner.engine.gpu_locks import GpusBusyError
from autotuner.errors import InfrastructureError, ScenarioError, UserInputError


@pytest.mark.parametrize("exc", [UserInputError("bad flag"), ScenarioError("bad flag"), GpusBusyError("bad flag")])
def test_bad_input_and_busy_gpus_exit_2_with_one_line(exc: Exception, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised, command_errors():
        raise exc
    assert raised.value.exit_code == 2
    assert capsys.readouterr().err == "error: bad flag\n"


@pytest.mark.parametrize("exc", [InfrastructureError("port taken"), RuntimeError("a bug"),
                                 sqlite3.OperationalError("x")])
def test_anything_else_keeps_its_traceback(exc: Exception, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(type(exc)), command_errors():
        raise exc
    assert capsys.readouterr().err == ""


def test_an_exit_passes_through(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised, command_errors(storage_url="sqlite:///x.db"):
        raise typer.Exit(7)
    assert raised.value.exit_code == 7
    assert capsys.readouterr().err == ""


def test_a_failing_study_database_exits_1_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised, command_errors(storage_url="sqlite:///x.db"):
        raise sqlite3.OperationalError("database or disk is full")
    assert raised.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: storage ") and "database or disk is full" in err and err.count("\n") == 1


def test_bad_input_wins_over_a_database_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """As before the wrapper: bad input is exit 2 even when a database error lies under it."""
    with pytest.raises(typer.Exit) as raised, command_errors(storage_url="sqlite:///x.db"):
        try:
            raise sqlite3.OperationalError("locked")
        except sqlite3.OperationalError:
            raise UserInputError("storage x.db: locked") from None
    assert raised.value.exit_code == 2
