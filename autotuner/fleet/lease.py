"""Who tunes for a group: the box holding the group's claim row. A claim is taken or renewed by one
conditional UPDATE (`... WHERE holder = me OR expires_at < now`), which PostgreSQL and SQLite each run
atomically: of two boxes asking at once, the database lets one row count say which won. A tuner renews
its lease while it tunes; a SIGKILLed tuner stops renewing, its lease runs out, and the next box to ask
takes the claim over with the study it was running (Optuna resumes it from the same storage).

After a tune the claim stays with its holder for `hold_s` (the group's min interval between tunes), so
that the group's other boxes, whose triggers fired for the same reason, adopt instead of re-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from autotuner.fleet.tables import claims

TUNING, DONE, FAILED = "tuning", "done", "failed"


@dataclass(frozen=True)
class Claim:
    group_key: str
    holder: str
    state: str
    study_name: str | None
    expires_at: float
    claimed_at: float
    taken_over_from: str | None = None
    reason: str | None = None


def _claim(row: sa.Row[tuple[object, ...]]) -> Claim:
    m = row._mapping
    return Claim(m["group_key"], m["holder"], m["state"], m["study_name"], m["expires_at"], m["claimed_at"],
                 m["taken_over_from"], m["reason"])


def current(engine: Engine, group: str) -> Claim | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(claims).where(claims.c.group_key == group)).first()
    return None if row is None else _claim(row)


def claim(engine: Engine, group: str, family: str, box: str, ttl_s: float, now: float) -> Claim | None:
    """The group's tune for `box`, or None when another box holds it. A claim taken from a holder whose
    lease ran out mid-tune keeps that tune's study, so the new holder resumes it."""
    before = current(engine, group)
    if before is None:
        try:
            with engine.begin() as conn:
                conn.execute(claims.insert().values(group_key=group, family_key=family, holder=box, state=TUNING,
                                                    expires_at=now + ttl_s, claimed_at=now))
        except IntegrityError:
            return None  # another box inserted the group's row first: it tunes
        return current(engine, group)
    takes_over = before.holder != box and before.state == TUNING
    resumes = takes_over or (before.holder == box and before.state == TUNING)  # a tune in flight: its study
    with engine.begin() as conn:
        won = conn.execute(claims.update().where(
            claims.c.group_key == group,
            sa.or_(claims.c.holder == box, claims.c.expires_at < now),
        ).values(holder=box, state=TUNING, expires_at=now + ttl_s, claimed_at=now, reason=None,
                 study_name=before.study_name if resumes else None,
                 taken_over_from=before.holder if takes_over else None)).rowcount
    return current(engine, group) if won == 1 else None


def renew(engine: Engine, group: str, box: str, ttl_s: float, now: float, study: str | None = None) -> bool:
    """Extend the lease (and name the study being tuned); False when the claim is no longer this box's."""
    values: dict[str, object] = {"expires_at": now + ttl_s}
    if study is not None:
        values["study_name"] = study
    with engine.begin() as conn:
        return bool(conn.execute(claims.update().where(
            claims.c.group_key == group, claims.c.holder == box, claims.c.state == TUNING).values(**values)).rowcount)


def finish(engine: Engine, group: str, box: str, ok: bool, hold_s: float, now: float,
           reason: str | None = None) -> None:
    """The tune is over: held `hold_s` after a success (the others adopt), released at once after a failure
    (another box may try)."""
    with engine.begin() as conn:
        conn.execute(claims.update().where(claims.c.group_key == group, claims.c.holder == box).values(
            state=DONE if ok else FAILED, expires_at=now + hold_s if ok else now, reason=reason))
