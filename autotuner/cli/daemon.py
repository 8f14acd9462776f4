"""`autotuner daemon run` and `autotuner daemon status`: the daemon in the foreground, and what it is
doing and has done, read from its database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import LOG_FORMAT_HELP, configure_logging, log_to_file
from autotuner.errors import UserInputError

if TYPE_CHECKING:
    from autotuner.daemon.config import LoadedConfig
    from autotuner.store.db import Store

RUN_EPILOG = ("Signals: SIGTERM finishes or rolls back the step in flight, then exits 0; SIGHUP reloads CONFIG. "
              "Exit status: 0 stopped cleanly; 2 bad CONFIG (nothing started).")


def daemon_run(
    config: Path = typer.Argument(..., help="daemon config YAML (see the README's daemon section)"),
    log_format: str = typer.Option("json", "--log-format", help=LOG_FORMAT_HELP),
) -> None:
    """Run the daemon in the foreground (as a systemd or compose service)."""
    import asyncio  # start-up time, as the imports below

    from autotuner.daemon.loop import Daemon

    configure_logging(log_format)
    with command_errors():
        daemon = Daemon(config)
    log_to_file(f"{daemon.states.deployment}-daemon", True)
    with command_errors():
        code = asyncio.run(daemon.run())
    raise typer.Exit(code)


def daemon_status(
    config: Path = typer.Argument(..., help="daemon config YAML"),
    as_json: bool = typer.Option(False, "--json", help="print what GET /status answers, as JSON"),
) -> None:
    """What the daemon is doing and has done, read from its database (the same facts as GET /status)."""
    from autotuner.daemon.config import load_config  # start-up time, as the imports below
    from autotuner.daemon.state import CycleStore
    from autotuner.daemon.status import status_document, status_lines

    with command_errors():
        loaded = load_config(config)
        states = CycleStore(_daemon_store(loaded), loaded.scenario.name)
        doc = status_document(states, loaded.config)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        for line in status_lines(doc):
            typer.echo(line)


def _daemon_store(loaded: LoadedConfig) -> Store:
    from autotuner.store.db import Store, sqlalchemy_url  # SQLAlchemy: start-up time

    url = sqlalchemy_url(loaded.config.storage_url())
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserInputError(f"storage {url.removeprefix('sqlite:///')}: no database yet — has `autotuner daemon "
                             "run` started with this config?")
    return Store(url)
