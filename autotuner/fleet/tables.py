"""The fleet's tables beside the studies' (SQLAlchemy Core, SQLite and PostgreSQL alike). Every decision
between boxes is one of these rows changed in a transaction: no message passes between daemons."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, ProgrammingError

from autotuner.secrets import redact, redact_value

metadata = sa.MetaData()

# One row per box: its group, what it runs, whether production answered at its last poll.
boxes = sa.Table(
    "at_fleet_boxes", metadata,
    sa.Column("box", sa.String(255), primary_key=True),
    sa.Column("group_key", sa.String(64), nullable=False, index=True),
    sa.Column("family_key", sa.String(64), nullable=False),  # the group without its GPUs: warm starts
    sa.Column("deployment", sa.String(512), nullable=False),
    sa.Column("describe", sa.Text, nullable=False),  # JSON: model, GPUs, engine, workload
    sa.Column("live_flags", sa.Text, nullable=True),  # JSON
    sa.Column("certificate", sa.Text, nullable=True),  # JSON: study, trial, lines
    sa.Column("healthy", sa.Boolean, nullable=False, default=False),
    sa.Column("seen_at", sa.Float, nullable=False),
)

# One row per group: who tunes for it, until when (a lease a dead box's claim runs out of).
claims = sa.Table(
    "at_fleet_claims", metadata,
    sa.Column("group_key", sa.String(64), primary_key=True),
    sa.Column("family_key", sa.String(64), nullable=False),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # tuning | done | failed
    sa.Column("study_name", sa.String(512), nullable=True),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.Column("taken_over_from", sa.String(255), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
)

# A confirmed, soaked winner on its way through a group, and each box's adoption of it.
rollouts = sa.Table(
    "at_fleet_rollouts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("group_key", sa.String(64), nullable=False, index=True),
    sa.Column("study_name", sa.String(512), nullable=True),
    sa.Column("trial", sa.Integer, nullable=True),
    sa.Column("flags", sa.Text, nullable=False),  # JSON
    sa.Column("certificate", sa.Text, nullable=True),  # JSON
    sa.Column("tuned_by", sa.String(255), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # canary | rolling | halted | superseded
    sa.Column("canary_box", sa.String(255), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    # Other processes' memory on the tuning box's GPUs (the most on any): a box with more re-tunes instead.
    sa.Column("foreign_bytes", sa.BigInteger, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

adoptions = sa.Table(
    "at_fleet_adoptions", metadata,
    sa.Column("rollout_id", sa.Integer, primary_key=True),
    sa.Column("box", sa.String(255), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),  # adopting | adopted | failed | retuned
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
)


def create(engine: Engine) -> None:
    """The tables, created once whichever box starts first (PostgreSQL's CREATE TABLE races: the loser
    finds them made)."""
    for attempt in range(5):
        try:
            metadata.create_all(engine)
            return
        except (IntegrityError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def dump(value: Any) -> str | None:
    """JSON for a row, masked: a certificate may quote an engine's message, and a message a secret."""
    return None if value is None else redact(json.dumps(redact_value(value), default=str, sort_keys=True))


def load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
