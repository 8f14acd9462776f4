"""The daemon's live facts, one row per deployment, written as they change and at every poll: which
process is the daemon (PID and start time, so that a reused PID is not mistaken for it), its heartbeat,
whether production answers /health and since when, the downtime production's own health showed (planned:
inside a cycle that took it down; unplanned: anything else), and the flags the daemon last put live (so a
hand edit of the live file is seen). `daemon status` reads it to say whether the daemon is alive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psutil
import sqlalchemy as sa

from autotuner.daemon.state import _dump, _load, metadata
from autotuner.proc_identity import create_time
from autotuner.store.db import Store

runtime = sa.Table(
    "at_daemon_runtime", metadata,
    sa.Column("deployment", sa.String(512), primary_key=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("create_time", sa.Float, nullable=True),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("heartbeat_at", sa.Float, nullable=True),
    sa.Column("stopped_at", sa.Float, nullable=True),
    sa.Column("production_up", sa.Boolean, nullable=True),
    sa.Column("production_since", sa.Float, nullable=True),  # up or down since
    sa.Column("production_error", sa.Text, nullable=True),
    sa.Column("last_poll_success_at", sa.Float, nullable=True),
    sa.Column("downtime_planned_s", sa.Float, nullable=False, default=0.0),
    sa.Column("downtime_unplanned_s", sa.Float, nullable=False, default=0.0),
    sa.Column("live_flags", sa.Text, nullable=True),  # JSON: what the daemon last put live or adopted
    sa.Column("alarm", sa.Text, nullable=True),  # production down and the daemon could not bring it back
)

# A heartbeat older than this many poll intervals (and at least this many seconds) means the daemon is gone.
STALE_POLLS = 3
STALE_MIN_S = 30.0


@dataclass
class Runtime:
    deployment: str
    pid: int | None = None
    create_time: float | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    stopped_at: float | None = None
    production_up: bool | None = None
    production_since: float | None = None
    production_error: str | None = None
    last_poll_success_at: float | None = None
    downtime_planned_s: float = 0.0
    downtime_unplanned_s: float = 0.0
    live_flags: dict[str, Any] | None = None
    alarm: str | None = None

    @property
    def downtime_s(self) -> float:
        return self.downtime_planned_s + self.downtime_unplanned_s

    def alive(self, poll_interval_s: float, now: float | None = None) -> bool:
        """The process that wrote this row still runs (same PID, same start time) and beats."""
        if self.pid is None or self.stopped_at is not None:
            return False
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        if self.create_time is not None and abs((create_time(self.pid) or 0.0) - self.create_time) > 1.0:
            return False
        now = time.time() if now is None else now
        stale = max(STALE_MIN_S, STALE_POLLS * poll_interval_s)
        return self.heartbeat_at is not None and now - self.heartbeat_at <= stale


class RuntimeStore:
    def __init__(self, store: Store, deployment: str) -> None:
        self.engine = store.engine
        self.deployment = deployment
        runtime.create(self.engine, checkfirst=True)

    def get(self) -> Runtime:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runtime).where(runtime.c.deployment == self.deployment)).first()
        if row is None:
            return Runtime(self.deployment)
        data = dict(row._mapping)
        data["live_flags"] = _load(data["live_flags"])
        data["downtime_planned_s"] = data["downtime_planned_s"] or 0.0
        data["downtime_unplanned_s"] = data["downtime_unplanned_s"] or 0.0
        return Runtime(**data)

    def set(self, **values: Any) -> None:
        if "live_flags" in values:
            values["live_flags"] = _dump(values["live_flags"])
        with self.engine.begin() as conn:
            updated = conn.execute(runtime.update().where(runtime.c.deployment == self.deployment)
                                   .values(**values)).rowcount
            if not updated:
                conn.execute(runtime.insert().values(deployment=self.deployment, downtime_planned_s=0.0,
                                                     downtime_unplanned_s=0.0, **values))

    def add_downtime(self, seconds: float, planned: bool) -> None:
        column = runtime.c.downtime_planned_s if planned else runtime.c.downtime_unplanned_s
        with self.engine.begin() as conn:
            updated = conn.execute(runtime.update().where(runtime.c.deployment == self.deployment)
                                   .values({column: column + seconds})).rowcount
            if not updated:
                conn.execute(runtime.insert().values(deployment=self.deployment,
                                                     downtime_planned_s=seconds if planned else 0.0,
                                                     downtime_unplanned_s=0.0 if planned else seconds))
