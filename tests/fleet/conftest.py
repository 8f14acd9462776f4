"""The fleet's databases: a real SQLite file and a real PostgreSQL (pgserver, as the shared-study tests
use), one server for the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from autotuner.store.db import Store


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pgserver = pytest.importorskip("pgserver")
    server = pgserver.get_server(tmp_path_factory.mktemp("fleet-pg"), cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A fresh fleet database of each kind (on PostgreSQL: the fleet's tables emptied first)."""
    from autotuner.fleet.tables import create, metadata

    store = Store(str(tmp_path / "fleet.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url"))
    create(store.engine)
    if request.param == "postgresql":
        with store.engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
    yield store.engine
    store.engine.dispose()
