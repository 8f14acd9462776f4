"""Our own tables, beside Optuna's in the same database: what Optuna does not hold.

`at_studies`: one row per study, its key (model fingerprint, GPU inventory, engine version, workload
fingerprint) and the scenario it ran. `at_trials`: one row per finished trial (baseline included):
outcome, reason, the flags and full argv, all metrics, memory peaks and the downsampled timeline,
engine version, log path and tail. The only module with SQL.

No secret is stored: the scenario's environment is kept as written (`${VAR}` by name), and every text
written is masked as a safety net: values with `secrets.redact_value` before they are serialised (a
secret holding `"`, `\\` or non-ASCII is escaped by json.dumps and would no longer match), texts with
`secrets.redact`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

from autotuner.errors import InfrastructureError, UserInputError
from autotuner.secrets import display_url, redact, redact_value, remember_url_password

T = TypeVar("T")
# How long a SQLite writer waits for another one's lock before giving up (seconds).
SQLITE_TIMEOUT_ENV = "AUTOTUNER_SQLITE_TIMEOUT_S"
SQLITE_TIMEOUT_S = float(os.environ.get(SQLITE_TIMEOUT_ENV) or 60)
HEARTBEAT_S = 30
metadata = sa.MetaData()

at_studies = sa.Table(
    "at_studies", metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("scenario_name", sa.String(512), nullable=False),
    sa.Column("model_fingerprint", sa.String(128), nullable=False),
    sa.Column("gpu_inventory", sa.Text, nullable=False),  # JSON list
    sa.Column("engine_version", sa.String(128), nullable=False),
    sa.Column("workload_fingerprint", sa.String(128), nullable=False),
    sa.Column("key_digest", sa.String(64), nullable=False),
    sa.Column("scenario", sa.Text, nullable=False),  # JSON of the validated scenario
    sa.Column("scenario_path", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

at_trials = sa.Table(
    "at_trials", metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("trial_number", sa.Integer, primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),  # baseline | current | search | requeued
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),  # the Optuna state we told: COMPLETE | FAIL
    sa.Column("flags", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),  # JSON: TrialResult without timeline and log tail
    sa.Column("timeline", sa.Text, nullable=True),
    sa.Column("log_tail", sa.Text, nullable=True),
    sa.Column("engine_version", sa.String(128), nullable=True),
    sa.Column("log_path", sa.Text, nullable=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class StudyKey:
    model_fingerprint: str
    gpu_inventory: list[str]
    engine_version: str
    workload_fingerprint: str

    def digest(self) -> str:
        import hashlib

        blob = json.dumps([self.model_fingerprint, self.gpu_inventory, self.engine_version,
                           self.workload_fingerprint])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass
class StudyRecord:
    study_name: str
    scenario_name: str
    key: StudyKey
    scenario: dict[str, Any]
    scenario_path: str | None
    created_at: float


@dataclass
class TrialRecord:
    trial_number: int
    kind: str
    outcome: str
    reason: str | None
    state: str
    flags: dict[str, Any]
    result: dict[str, Any]
    timeline: list[Any] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.result.get("metrics") or {})

    @property
    def memory(self) -> dict[str, Any]:
        return dict(self.result.get("memory") or {})

    @property
    def engine(self) -> dict[str, Any]:
        return dict(self.result.get("engine") or {})


def sqlalchemy_url(url: str) -> str:
    """Storage URL as the user gives it: a SQLAlchemy URL, or a bare path meaning SQLite."""
    if "://" not in url:
        from pathlib import Path

        try:
            return f"sqlite:///{Path(url).expanduser().resolve()}"
        except (OSError, RuntimeError, ValueError) as exc:  # NUL bytes, ~nosuchuser, a loop of links
            raise UserInputError(f"storage {url!r}: not a usable path ({exc}); give a SQLite file path or a "
                                 "SQLAlchemy URL such as postgresql://user@host/db") from None
    return url


def engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    return {"pool_pre_ping": True}


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # WAL: a dashboard (optuna-dashboard) can read while the tuner writes.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_TIMEOUT_S * 1000)}")
        cursor.close()


class Store:
    """Our tables in the study database. Construct with the same URL Optuna uses."""

    def __init__(self, url: str, create: bool = True) -> None:
        remember_url_password(url)  # from here on, every message and row is masked for it
        self.url = sqlalchemy_url(url)
        shown = display_url(url)
        if self.url.startswith("sqlite:///"):
            from pathlib import Path

            parent = Path(self.url.removeprefix("sqlite:///")).parent
            try:
                exists = parent.is_dir()
            except (OSError, ValueError):
                exists = False
            if not exists:
                raise UserInputError(f"storage {shown}: directory {parent} does not exist")
            if create and not self.url.endswith((":memory:", "///")):
                from autotuner.private_files import create_empty

                # 0600: run details. Unwritable or not a file: SQLite's own message below says which.
                with contextlib.suppress(OSError):
                    create_empty(Path(self.url.removeprefix("sqlite:///").partition("?")[0]))
        try:
            self.engine = sa.create_engine(self.url, **engine_kwargs(self.url))
        except (SQLAlchemyError, ImportError, ValueError, TypeError) as exc:
            raise UserInputError(redact(f"storage {shown}: {exc}; give a SQLite file path or a SQLAlchemy URL "
                                        "such as postgresql://user@host/db")) from None
        if self.url.startswith("sqlite"):
            _sqlite_pragmas(self.engine)
        try:
            if create:
                _racing_workers(lambda: metadata.create_all(self.engine))
            else:
                with self.engine.connect():
                    pass
        except OperationalError as exc:
            self.engine.dispose()
            raise UserInputError(redact(f"storage {shown} is unreachable: {exc.orig}")) from None
        except (SQLAlchemyError, ImportError, ValueError, TypeError) as exc:
            self.engine.dispose()
            raise UserInputError(redact(f"storage {shown} cannot be used: {getattr(exc, 'orig', None) or exc}")) \
                from None

    def optuna_storage(self):  # type: ignore[no-untyped-def]
        """Optuna's storage on the same database. Shared databases (PostgreSQL: several boxes, one
        study) get heartbeats, so a worker that died is told apart from one still measuring."""
        import optuna

        def storage() -> optuna.storages.RDBStorage:
            # Heartbeats are what tell a dead worker from a slow one here, chosen knowingly: Optuna's
            # "experimental" marks on them are no news to the user.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                kwargs: dict[str, Any] = {}
                if not self.is_sqlite:
                    kwargs.update(heartbeat_interval=HEARTBEAT_S, grace_period=HEARTBEAT_S * 4,
                                  heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                                      max_retry=1))
                return optuna.storages.RDBStorage(self.url, engine_kwargs=engine_kwargs(self.url), **kwargs)

        return _racing_workers(storage)

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    # --- studies -----------------------------------------------------------------------------------
    def save_study(self, record: StudyRecord) -> bool:
        """True when this call created the study's row (the first of several workers to arrive)."""
        row = {
            "study_name": record.study_name, "scenario_name": record.scenario_name,
            "model_fingerprint": record.key.model_fingerprint,
            "gpu_inventory": json.dumps(record.key.gpu_inventory),
            "engine_version": record.key.engine_version,
            "workload_fingerprint": record.key.workload_fingerprint, "key_digest": record.key.digest(),
            "scenario": redact(json.dumps(redact_value(record.scenario), default=str)),
            "scenario_path": record.scenario_path,
            "created_at": record.created_at,
        }
        try:
            with self.engine.begin() as conn:
                exists = conn.execute(sa.select(at_studies.c.study_name).where(
                    at_studies.c.study_name == record.study_name)).first()
                if exists is not None:
                    return False
                conn.execute(at_studies.insert().values(**row))
        except IntegrityError:
            return False  # another worker created it between our read and our write
        return True

    def study(self, name: str) -> StudyRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(at_studies).where(at_studies.c.study_name == name)).mappings().first()
        return None if row is None else _study(row)

    def studies(self) -> list[StudyRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(at_studies).order_by(at_studies.c.created_at)).mappings().all()
        return [_study(r) for r in rows]

    # --- trials ------------------------------------------------------------------------------------
    def save_trial(self, study_name: str, record: TrialRecord) -> None:
        """Idempotent: a trial number is written once (a resumed run never duplicates it)."""
        result = {k: v for k, v in record.result.items() if k not in ("log_tail",)}
        memory = dict(result.get("memory") or {})
        timeline = memory.pop("timeline", record.timeline)
        result["memory"] = memory
        engine = result.get("engine") or {}
        row = {
            "study_name": study_name, "trial_number": record.trial_number, "kind": record.kind,
            "outcome": record.outcome, "reason": None if record.reason is None else redact(record.reason),
            "state": record.state, "flags": redact(json.dumps(redact_value(record.flags), default=str)),
            "result": redact(json.dumps(redact_value(result), default=str)), "timeline": json.dumps(timeline),
            "log_tail": redact("\n".join(record.log_tail)),
            "engine_version": engine.get("version"), "log_path": engine.get("log_path"),
            "started_at": record.started_at, "finished_at": record.finished_at,
        }
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(at_trials.c.trial_number).where(
                at_trials.c.study_name == study_name, at_trials.c.trial_number == record.trial_number)).first()
            if exists is None:
                conn.execute(at_trials.insert().values(**row))

    def delete_trial(self, study_name: str, number: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(at_trials.delete().where(at_trials.c.study_name == study_name,
                                                  at_trials.c.trial_number == number))

    def trials(self, study_name: str) -> list[TrialRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(at_trials).where(at_trials.c.study_name == study_name)
                                .order_by(at_trials.c.trial_number)).mappings().all()
        return [_trial(r) for r in rows]


class StorageError(InfrastructureError):
    """The study database failed under a running study: disk full, locked by another writer, read-only."""


# SQLite's words for what went wrong, and what the operator can do about it.
_STORAGE_HINTS = (
    ("disk is full", "free space on the disk that holds it"),
    ("database is locked", f"another process holds a write lock on it (waited {SQLITE_TIMEOUT_S:g} s; "
                           f"{SQLITE_TIMEOUT_ENV} sets how long): stop that process"),
    ("readonly", "it is read-only: make the file and its directory writable, or use another --storage"),
    ("read-only", "it is read-only: make the file and its directory writable, or use another --storage"),
    ("unable to open", "its directory must exist and be writable"),
    ("disk i/o error", "the disk that holds it failed a read or write"),
)


def storage_error(exc: BaseException, url: str) -> StorageError | None:
    """A failure of the study database (ours, or Optuna's, which hides the cause behind a generic
    StorageInternalError) as one clear message; None when `exc` is not a database failure."""
    seen: BaseException | None = exc
    cause: BaseException | None = None
    while seen is not None:
        if isinstance(seen, sa.exc.DBAPIError) and seen.orig is not None:
            cause = seen.orig
            break
        if isinstance(seen, sqlite3.Error | sa.exc.SQLAlchemyError):
            cause = seen
            break
        seen = seen.__cause__ or seen.__context__
    if cause is None:
        return None
    what = redact(str(cause).strip() or type(cause).__name__)
    hint = next((h for key, h in _STORAGE_HINTS if key in what.lower()), "check the database and its disk")
    return StorageError(f"storage {display_url(url)}: {what}: {hint}. The trial in flight was not recorded (its engine "
                        "was stopped); run the same command again to resume the study")


def _racing_workers(create: Callable[[], T]) -> T:
    """Several workers starting on a fresh shared database race to create the same tables and types
    (PostgreSQL's CREATE TYPE is not idempotent): the loser tries again once the winner is done."""
    for attempt in range(5):
        try:
            return create()
        except (IntegrityError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _study(row: Any) -> StudyRecord:
    key = StudyKey(row["model_fingerprint"], json.loads(row["gpu_inventory"]), row["engine_version"],
                   row["workload_fingerprint"])
    return StudyRecord(row["study_name"], row["scenario_name"], key, json.loads(row["scenario"]),
                       row["scenario_path"], row["created_at"])


def _trial(row: Any) -> TrialRecord:
    return TrialRecord(
        trial_number=row["trial_number"], kind=row["kind"], outcome=row["outcome"], reason=row["reason"],
        state=row["state"], flags=json.loads(row["flags"]), result=json.loads(row["result"]),
        timeline=json.loads(row["timeline"] or "[]"),
        log_tail=(row["log_tail"] or "").split("\n") if row["log_tail"] else [],
        started_at=row["started_at"], finished_at=row["finished_at"],
    )


def now() -> float:
    return time.time()
