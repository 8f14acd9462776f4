"""`autotuner fleet status`: the fleet sharing a storage, read from the database (any box, or none)."""

from __future__ import annotations

import json

import typer

from autotuner.cli.exits import command_errors
from autotuner.cli.options import DEFAULT_STORAGE


def fleet_status(
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", help="the fleet's storage: SQLite path or "
                                "SQLAlchemy URL (a password as ${VAR}, read from the environment)"),
    as_json: bool = typer.Option(False, "--json", help="the document each daemon's GET /status carries as `fleet`"),
) -> None:
    """The groups, which box tuned for each, which adopted, each box's config and certificate, rollouts in
    flight."""
    from autotuner.env_references import expand
    from autotuner.fleet.status import fleet_status as document
    from autotuner.fleet.status import render
    from autotuner.store.db import Store

    with command_errors(storage):
        store = Store(expand(storage) if "://" in storage else storage, create=False)
        doc = document(store.engine)
        store.engine.dispose()
    typer.echo(json.dumps(doc, indent=2, default=str) if as_json else render(doc))
