"""What production refused, so that it is never offered again: a config that failed to start, failed
verify or OOMed in production, or that a person rejected, recorded with its reason for one fingerprint.
A failed start or an OOM is the box's answer (model, GPUs, engine version: `box_fingerprint`), whatever the
workload the next cycle tunes for; a failed verify or a rejection holds for one workload too
(`refusal_fingerprint`). `refused(...)` takes both. Repeated failed cycles back off exponentially
(`backoff_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from autotuner.daemon.known_good import flags_key
from autotuner.daemon.state import _dump, _load, metadata
from autotuner.store.db import Store

START, VERIFY, OOM, REJECTED = "start", "verify", "oom", "rejected"
_STRENGTH = {START: 0, VERIFY: 1, OOM: 2, REJECTED: 2}

refusals = sa.Table(
    "at_daemon_refusals", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("deployment", sa.String(512), nullable=False, index=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("flags_key", sa.String(4096), nullable=False),
    sa.Column("flags", sa.Text, nullable=False),  # JSON
    sa.Column("kind", sa.String(16), nullable=False),  # start | verify | oom | rejected
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("cycle_id", sa.Integer, nullable=True),
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("last_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Refusal:
    flags: dict[str, Any]
    kind: str
    reason: str
    count: int
    cycle_id: int | None
    last_at: float


class Refusals:
    def __init__(self, store: Store, deployment: str) -> None:
        self.engine = store.engine
        self.deployment = deployment
        refusals.create(self.engine, checkfirst=True)

    def record(self, fingerprint: str, flags: dict[str, Any], kind: str, reason: str,
               cycle_id: int | None = None) -> None:
        key, now = flags_key(flags), time.time()
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(refusals.c.id, refusals.c.count, refusals.c.kind).where(
                refusals.c.deployment == self.deployment, refusals.c.fingerprint == fingerprint,
                refusals.c.flags_key == key)).first()
            if row is None:
                conn.execute(refusals.insert().values(
                    deployment=self.deployment, fingerprint=fingerprint, flags_key=key, flags=_dump(flags),
                    kind=kind, reason=reason[:2000], count=1, cycle_id=cycle_id, first_at=now, last_at=now))
            elif _STRENGTH[kind] < _STRENGTH.get(row.kind, 0):
                # An OOM in production or a person's no outranks a later failed start (a busy GPU, a slow box):
                # the stronger answer is the one the operator must see.
                conn.execute(refusals.update().where(refusals.c.id == row.id).values(
                    count=row.count + 1, last_at=now))
            else:
                conn.execute(refusals.update().where(refusals.c.id == row.id).values(
                    kind=kind, reason=reason[:2000], count=row.count + 1, cycle_id=cycle_id, last_at=now))

    def refused(self, fingerprint: str | tuple[str, ...], flags: dict[str, Any]) -> Refusal | None:
        """The refusal of `flags` under any of the fingerprints given (the box's, the box and workload's)."""
        prints = (fingerprint,) if isinstance(fingerprint, str) else fingerprint
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(refusals).where(
                refusals.c.deployment == self.deployment, refusals.c.fingerprint.in_(prints),
                refusals.c.flags_key == flags_key(flags)).order_by(refusals.c.last_at.desc())).first()
        return None if r is None else Refusal(dict(_load(r.flags) or {}), r.kind, r.reason, r.count, r.cycle_id,
                                              r.last_at)

    def all(self, limit: int = 50) -> list[Refusal]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(refusals).where(refusals.c.deployment == self.deployment)
                                .order_by(refusals.c.last_at.desc()).limit(limit)).all()
        return [Refusal(dict(_load(r.flags) or {}), r.kind, r.reason, r.count, r.cycle_id, r.last_at) for r in rows]

    def total(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(refusals)
                                    .where(refusals.c.deployment == self.deployment)).scalar() or 0)


def backoff_s(base_s: float, failures: int, cap_s: float = 7 * 86400.0) -> float:
    """The wait before the next cycle after `failures` failed cycles in a row: the min interval, then twice
    it, four times, … (capped at a week; a min interval under a second counts as one second)."""
    if failures <= 0:
        return base_s
    return min(cap_s, max(base_s, 1.0) * 2.0 ** failures)
