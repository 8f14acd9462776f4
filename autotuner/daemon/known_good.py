"""The last-known-good chain: configs that served and verified on this box, newest first, each with the
certificate it was deployed with (none for the config production ran before the daemon adopted it).

When production will not start on what it runs, the daemon walks this chain rather than leave it down.
A config is entered (or moved to the front) each time production verified on it: adoption at first sight,
a verified deploy, a verified rollback. Entries belong to one box fingerprint (model, GPUs, engine version):
a config that served another model is no fallback for this one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from autotuner.daemon.state import _dump, _load, metadata
from autotuner.store.db import Store

known_good = sa.Table(
    "at_daemon_known_good", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("deployment", sa.String(512), nullable=False, index=True),
    sa.Column("box", sa.String(64), nullable=False),  # box_fingerprint of the identity it served on
    sa.Column("flags_key", sa.String(4096), nullable=False),  # canonical JSON of the flags
    sa.Column("flags", sa.Text, nullable=False),  # JSON
    sa.Column("certificate", sa.Text, nullable=True),  # JSON, as the cycle stored it
    sa.Column("source", sa.String(32), nullable=False),  # adopted | deployed | rolled-back | restored | ...
    sa.Column("cycle_id", sa.Integer, nullable=True),
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("verified_at", sa.Float, nullable=False),
)


def flags_key(flags: dict[str, Any] | None) -> str:
    """The same flags, the same key, whatever their order."""
    return json.dumps(flags or {}, sort_keys=True, default=str)


@dataclass(frozen=True)
class KnownGood:
    flags: dict[str, Any]
    certificate: dict[str, Any] | None
    source: str
    cycle_id: int | None
    verified_at: float

    @property
    def headroom_gib(self) -> float | None:
        """The smallest certified headroom over the GPUs (None: not certified, e.g. adopted)."""
        rooms = (self.certificate or {}).get("headroom_gib") or []
        return min(rooms) if rooms else None


class KnownGoodChain:
    def __init__(self, store: Store, deployment: str) -> None:
        self.engine = store.engine
        self.deployment = deployment
        known_good.create(self.engine, checkfirst=True)

    def record(self, flags: dict[str, Any], box: str, source: str, certificate: dict[str, Any] | None = None,
               cycle_id: int | None = None) -> None:
        """Production verified on `flags` now: enter them, or move them to the front of the chain."""
        key, now = flags_key(flags), time.time()
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(known_good.c.id, known_good.c.certificate).where(
                known_good.c.deployment == self.deployment, known_good.c.box == box,
                known_good.c.flags_key == key)).first()
            if row is None:
                conn.execute(known_good.insert().values(
                    deployment=self.deployment, box=box, flags_key=key, flags=_dump(flags),
                    certificate=_dump(certificate), source=source, cycle_id=cycle_id, first_at=now, verified_at=now))
            else:
                values: dict[str, Any] = {"verified_at": now, "source": source}
                if certificate is not None:
                    values["certificate"] = _dump(certificate)
                conn.execute(known_good.update().where(known_good.c.id == row.id).values(**values))

    def chain(self, box: str, limit: int = 10) -> list[KnownGood]:
        """Newest verified first."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(known_good).where(known_good.c.deployment == self.deployment,
                                                            known_good.c.box == box)
                                .order_by(known_good.c.verified_at.desc(), known_good.c.id.desc())
                                .limit(limit)).all()
        return [KnownGood(dict(_load(r.flags) or {}), _load(r.certificate), r.source, r.cycle_id, r.verified_at)
                for r in rows]

    def forget(self, flags: dict[str, Any], box: str) -> None:
        """A config that OOMed in production is no longer known to be good."""
        with self.engine.begin() as conn:
            conn.execute(known_good.delete().where(known_good.c.deployment == self.deployment,
                                                   known_good.c.box == box,
                                                   known_good.c.flags_key == flags_key(flags)))
