"""The cycle as data: its state, persisted in the study database before each step, so that a killed daemon
resumes at the step it was in. Every transition is an event row and a structlog JSON line.

    detect → window → [drain →] tune → confirm → [proposed →] deploy → verify → done
                                        ╰──────────────┴───────────────┴── rollback ──╯→ done

`window` and `proposed` park the cycle (the daemon keeps polling production meanwhile): until the
maintenance window opens, and until a person approves or rejects (`approve: manual`). `drain` is skipped
when the tune needs none of production's GPUs.

Tables beside the studies' (SQLAlchemy Core: SQLite and PostgreSQL alike): `at_daemon_cycles` (one row per
cycle, its current state and what it needs to resume), `at_daemon_events` (transitions and triggers, in
order) and `at_daemon_reference` (what production was when it was last tuned or adopted: the yardstick of
the triggers).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
import structlog

from autotuner.secrets import redact, redact_value
from autotuner.store.db import Store

log = structlog.get_logger("autotuner.daemon")

DETECT, WINDOW, DRAIN, TUNE, CONFIRM, PROPOSED, DEPLOY, VERIFY, ROLLBACK, DONE = (
    "detect", "window", "drain", "tune", "confirm", "proposed", "deploy", "verify", "rollback", "done")
STATES = (DETECT, WINDOW, DRAIN, TUNE, CONFIRM, PROPOSED, DEPLOY, VERIFY, ROLLBACK, DONE)
# Which step may follow which: anything else is a bug of ours, refused before it is written.
NEXT: dict[str, tuple[str, ...]] = {
    DETECT: (WINDOW, DONE),
    WINDOW: (DRAIN, TUNE, DONE),
    DRAIN: (TUNE, ROLLBACK),
    TUNE: (CONFIRM, ROLLBACK),
    CONFIRM: (PROPOSED, DEPLOY, ROLLBACK),
    PROPOSED: (DEPLOY, DONE, ROLLBACK),
    DEPLOY: (VERIFY, ROLLBACK),
    VERIFY: (DONE, ROLLBACK),
    ROLLBACK: (DONE,),
    DONE: (),
}
# How a cycle ended.
DEPLOYED, ROLLED_BACK, RESTORED, SKIPPED = "deployed", "rolled-back", "restored", "skipped"
# A cycle that ended in ROLLBACK without a verified previous config up: needs a person.
FAILED = "failed"
# A proposal a person rejected; a proposal written to a file target that cannot restart production.
REJECTED_OUTCOME, WRITTEN = "rejected", "written"
OUTCOMES = (DEPLOYED, ROLLED_BACK, RESTORED, SKIPPED, FAILED, REJECTED_OUTCOME, WRITTEN)
# Why a cycle was skipped when the daemon stopped (not a failure of the cycle).
STOP_REASON = "the daemon was asked to stop"
# Outcomes that count as a failed cycle for the backoff before the next one.
FAILED_OUTCOMES = (ROLLED_BACK, RESTORED, FAILED)

metadata = sa.MetaData()

cycles = sa.Table(
    "at_daemon_cycles", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("deployment", sa.String(512), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("trigger_kind", sa.String(32), nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),  # JSON
    sa.Column("observed", sa.Text, nullable=False),  # JSON: production's identity when triggered
    sa.Column("scenario", sa.Text, nullable=True),  # JSON: the scenario this cycle tunes
    sa.Column("study_name", sa.String(512), nullable=True),
    sa.Column("warm_start", sa.String(512), nullable=True),
    sa.Column("previous_flags", sa.Text, nullable=True),  # JSON: the live config before the cycle
    sa.Column("candidate_flags", sa.Text, nullable=True),  # JSON: the winner to roll out
    sa.Column("candidate_trial", sa.Integer, nullable=True),
    sa.Column("certificate", sa.Text, nullable=True),  # JSON: lines and headroom of the winner
    sa.Column("trials", sa.Integer, nullable=True),
    sa.Column("down_since", sa.Float, nullable=True),  # production taken down by us, since
    sa.Column("downtime_s", sa.Float, nullable=False, default=0.0),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
)

events = sa.Table(
    "at_daemon_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("deployment", sa.String(512), nullable=False, index=True),
    sa.Column("cycle_id", sa.Integer, nullable=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),  # transition | trigger | deferred | adopted | note
    sa.Column("from_state", sa.String(16), nullable=True),
    sa.Column("to_state", sa.String(16), nullable=True),
    sa.Column("detail", sa.Text, nullable=False),  # JSON
)

reference = sa.Table(
    "at_daemon_reference", metadata,
    sa.Column("deployment", sa.String(512), primary_key=True),
    sa.Column("data", sa.Text, nullable=False),  # JSON
    sa.Column("updated_at", sa.Float, nullable=False),
)

_JSON_COLUMNS = ("evidence", "observed", "scenario", "previous_flags", "candidate_flags", "certificate")


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN (GET /status must stay parseable): such a number is stored as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _dump(value: Any) -> str | None:
    return None if value is None else redact(json.dumps(redact_value(_finite(value)), default=str, sort_keys=True))


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass
class Cycle:
    id: int
    deployment: str
    state: str
    trigger_kind: str
    evidence: dict[str, Any]
    observed: dict[str, Any]
    started_at: float
    updated_at: float
    outcome: str | None = None
    reason: str | None = None
    scenario: dict[str, Any] | None = None
    study_name: str | None = None
    warm_start: str | None = None
    previous_flags: dict[str, Any] | None = None
    candidate_flags: dict[str, Any] | None = None
    candidate_trial: int | None = None
    certificate: dict[str, Any] | None = None
    trials: int | None = None
    down_since: float | None = None
    downtime_s: float = 0.0
    ended_at: float | None = None

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> Cycle:
        data = dict(row._mapping)
        for name in _JSON_COLUMNS:
            data[name] = _load(data[name])
        data["downtime_s"] = data["downtime_s"] or 0.0
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Event:
    id: int
    cycle_id: int | None
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    detail: dict[str, Any] = field(default_factory=dict)


class CycleStore:
    """The daemon's rows for one deployment (named by its scenario) in the study database."""

    def __init__(self, store: Store, deployment: str) -> None:
        self.store = store
        self.engine = store.engine
        self.deployment = deployment
        metadata.create_all(self.engine)

    # --- cycles ------------------------------------------------------------------------------------
    def open_cycle(self) -> Cycle | None:
        """The cycle a killed daemon left in flight (at most one)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(cycles).where(cycles.c.deployment == self.deployment,
                                                       cycles.c.state != DONE)
                               .order_by(cycles.c.id.desc()).limit(1)).first()
        return None if row is None else Cycle.from_row(row)

    def begin(self, trigger_kind: str, evidence: dict[str, Any], observed: dict[str, Any]) -> Cycle:
        now = time.time()
        with self.engine.begin() as conn:
            cycle_id = conn.execute(cycles.insert().values(
                deployment=self.deployment, state=DETECT, trigger_kind=trigger_kind, evidence=_dump(evidence),
                observed=_dump(observed), downtime_s=0.0, started_at=now, updated_at=now)).inserted_primary_key[0]
            self._event(conn, cycle_id, "transition", None, DETECT, {"trigger": trigger_kind, "evidence": evidence})
        log.info("daemon.transition", deployment=self.deployment, cycle=cycle_id, to_state=DETECT,
                 trigger=trigger_kind, evidence=evidence)
        cycle = self.cycle(int(cycle_id))
        assert cycle is not None
        return cycle

    def cycle(self, cycle_id: int) -> Cycle | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(cycles).where(cycles.c.id == cycle_id)).first()
        return None if row is None else Cycle.from_row(row)

    def update(self, cycle: Cycle, **changes: Any) -> Cycle:
        """Write fields of the cycle without changing its state (what the next step needs to resume)."""
        values = {k: (_dump(v) if k in _JSON_COLUMNS else redact_value(v)) for k, v in changes.items()}
        values["updated_at"] = time.time()
        with self.engine.begin() as conn:
            conn.execute(cycles.update().where(cycles.c.id == cycle.id).values(**values))
        for k, v in changes.items():
            setattr(cycle, k, v)
        cycle.updated_at = values["updated_at"]
        return cycle

    def transition(self, cycle: Cycle, to_state: str, detail: dict[str, Any] | None = None, **changes: Any) -> Cycle:
        """Move the cycle to its next state, with the fields that state needs, in one transaction."""
        if to_state not in NEXT[cycle.state]:
            raise ValueError(f"cycle {cycle.id}: {cycle.state} → {to_state} is not a step of the cycle")
        now = time.time()
        if to_state == DONE:
            changes.setdefault("ended_at", now)
        values = {k: (_dump(v) if k in _JSON_COLUMNS else redact_value(v)) for k, v in changes.items()}
        values.update(state=to_state, updated_at=now)
        detail = {**(detail or {}), **({"outcome": changes["outcome"]} if "outcome" in changes else {})}
        with self.engine.begin() as conn:
            conn.execute(cycles.update().where(cycles.c.id == cycle.id).values(**values))
            self._event(conn, cycle.id, "transition", cycle.state, to_state, detail)
        log.info("daemon.transition", deployment=self.deployment, cycle=cycle.id, from_state=cycle.state,
                 to_state=to_state, **detail)
        for k, v in changes.items():
            setattr(cycle, k, v)
        cycle.state, cycle.updated_at = to_state, now
        return cycle

    def cycles(self, limit: int = 20) -> list[Cycle]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(cycles).where(cycles.c.deployment == self.deployment)
                                .order_by(cycles.c.id.desc()).limit(limit)).all()
        return [Cycle.from_row(r) for r in rows]

    def last_deployed(self) -> Cycle | None:
        """The last cycle that put a verified new config into production."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(cycles).where(cycles.c.deployment == self.deployment,
                                                       cycles.c.outcome == DEPLOYED)
                               .order_by(cycles.c.id.desc()).limit(1)).first()
        return None if row is None else Cycle.from_row(row)

    def last_study(self) -> str | None:
        """The next cycle's warm start: the study of this deployment's last cycle that tuned anything, else
        the newest study of its scenario in the storage (a `tune` run before the daemon started)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(cycles.c.study_name).where(
                cycles.c.deployment == self.deployment, cycles.c.study_name.is_not(None),
                cycles.c.trials > 0).order_by(cycles.c.id.desc()).limit(1)).first()
        if row is not None:
            return str(row[0])
        own = [s for s in self.store.studies() if s.scenario_name == self.deployment]
        return own[-1].study_name if own else None

    def add_downtime(self, cycle_id: int, seconds: float) -> None:
        """Production's own health saw it down this long during the cycle."""
        with self.engine.begin() as conn:
            conn.execute(cycles.update().where(cycles.c.id == cycle_id)
                         .values(downtime_s=cycles.c.downtime_s + seconds))

    def decide(self, cycle_id: int, verdict: str, who: str) -> None:
        """A person's approve/reject of a proposed cycle (written by `autotuner daemon approve|reject`)."""
        with self.engine.begin() as conn:
            self._event(conn, cycle_id, "decision", None, None, {"verdict": verdict, "by": who})

    def decision(self, cycle_id: int) -> tuple[str, str] | None:
        found = self.events(kind="decision", cycle_id=cycle_id, limit=1)
        return None if not found else (str(found[0].detail.get("verdict")), str(found[0].detail.get("by")))

    def failures_in_a_row(self) -> int:
        """Cycles that ended failed, newest first, until one that did not (skipped ones do not break it)."""
        n = 0
        for c in self.cycles(limit=20):
            if c.state != DONE or STOP_REASON in (c.reason or ""):  # stopped by a person: not the cycle's failure
                continue
            # A cycle skipped because it cannot tune (a target that cannot take production down) fails again
            # at once: it backs off like a failed one instead of coming back every min_interval_s.
            if c.outcome not in FAILED_OUTCOMES and c.outcome != SKIPPED:
                break
            n += 1
        return n

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(cycles.c.outcome, sa.func.count(), sa.func.sum(cycles.c.trials))
                                .where(cycles.c.deployment == self.deployment).group_by(cycles.c.outcome)).all()
        out = {"cycles": 0, "trials": 0}
        for outcome, n, trials in rows:
            out["cycles"] += int(n)
            out["trials"] += int(trials or 0)
            out[str(outcome or "in-flight")] = int(n)
        return out

    # --- events ------------------------------------------------------------------------------------
    def _event(self, conn: sa.Connection, cycle_id: int | None, kind: str, from_state: str | None,
               to_state: str | None, detail: dict[str, Any]) -> None:
        conn.execute(events.insert().values(deployment=self.deployment, cycle_id=cycle_id, at=time.time(), kind=kind,
                                            from_state=from_state, to_state=to_state, detail=_dump(detail)))

    def note(self, kind: str, detail: dict[str, Any], cycle_id: int | None = None) -> None:
        """A trigger seen, a trigger deferred, production adopted as the reference, ..."""
        with self.engine.begin() as conn:
            self._event(conn, cycle_id, kind, None, None, detail)
        log.info(f"daemon.{kind}", deployment=self.deployment, cycle=cycle_id, **detail)

    def events(self, kind: str | None = None, limit: int = 50, cycle_id: int | None = None) -> list[Event]:
        query = sa.select(events).where(events.c.deployment == self.deployment)
        if kind is not None:
            query = query.where(events.c.kind == kind)
        if cycle_id is not None:
            query = query.where(events.c.cycle_id == cycle_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(events.c.id.desc()).limit(limit)).all()
        return [Event(r.id, r.cycle_id, r.at, r.kind, r.from_state, r.to_state, _load(r.detail) or {}) for r in rows]

    # --- the reference -----------------------------------------------------------------------------
    def reference(self) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(reference.c.data).where(reference.c.deployment == self.deployment)).first()
        return None if row is None else dict(_load(row[0]))

    def set_reference(self, data: dict[str, Any]) -> None:
        text, now = _dump(data), time.time()
        with self.engine.begin() as conn:
            updated = conn.execute(reference.update().where(reference.c.deployment == self.deployment)
                                   .values(data=text, updated_at=now)).rowcount
            if not updated:
                conn.execute(reference.insert().values(deployment=self.deployment, data=text, updated_at=now))
