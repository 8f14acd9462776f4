"""How a command's failure reaches the user: one `error: MESSAGE` line on stderr and an exit code, no
traceback. Bad input (`UserInputError` and its kin) and GPUs that are not free exit 2, having
launched and written nothing; a study database that fails under a running study exits 1. Every other
exception is a bug and keeps its traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from autotuner.errors import InfrastructureError, UserInputError


def fail(message: object) -> typer.Exit:
    """Bad input: one clear message, exit code 2, nothing written."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@contextmanager
def command_errors(storage_url: str | None = None) -> Iterator[None]:
    """Around the part of a command that can fail on the user's input, or on the GPUs being taken:
    those exit 2 with their message. With `storage_url`, a failure of that study database (disk
    full, locked, read-only) says so once and exits 1."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:
        if isinstance(exc, UserInputError) or _gpus_busy(exc):
            raise fail(exc) from None
        failure = _storage_failure(exc, storage_url) if storage_url is not None else None
        if failure is None:
            raise
        typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(1) from None


def _gpus_busy(exc: Exception) -> bool:
    if not isinstance(exc, InfrastructureError):
        return False
    from autotuner.engine.gpu_locks import GpusBusyError  # imported on failure only: it brings psutil

    return isinstance(exc, GpusBusyError)


def _storage_failure(exc: Exception, url: str) -> Exception | None:
    from autotuner.store.db import storage_error  # imported on failure only: it brings SQLAlchemy

    return storage_error(exc, url)
