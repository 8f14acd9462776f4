"""A group's winner on its way to every box: the box that tuned publishes it (confirmed, soaked and
verified on its own production); one other box adopts it first, the canary; the rest only once the
canary has served on it healthily for `healthy_s`. Every box adopts through its own deploy and verify;
one that fails keeps its config and halts the rollout for the group, with its reason. A box with more of
other processes' memory on its GPUs than the box that tuned never adopts blindly: it declines (the group goes
on) and tunes for itself, warm-started from the group's study.

Each step is one conditional UPDATE or INSERT: the canary is whoever sets `canary_box` while it is
still NULL, an adoption is one (rollout, box) row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from autotuner.fleet.tables import adoptions, boxes, dump, load, rollouts

CANARY, ROLLING, HALTED, SUPERSEDED = "canary", "rolling", "halted", "superseded"
IN_FLIGHT = (CANARY, ROLLING)
ADOPTING, ADOPTED, FAILED, RETUNED = "adopting", "adopted", "failed", "retuned"


@dataclass(frozen=True)
class Rollout:
    id: int
    group_key: str
    study_name: str | None
    trial: int | None
    flags: dict[str, Any]
    certificate: dict[str, Any] | None
    tuned_by: str
    state: str
    canary_box: str | None
    reason: str | None
    created_at: float
    foreign_bytes: int | None = None


@dataclass(frozen=True)
class Step:
    """What a box does about its group's rollout now: adopt it (as the canary or after it), or wait."""

    rollout: Rollout
    adopt: bool
    canary: bool
    why: str


def _rollout(row: Any) -> Rollout:
    m = row._mapping
    return Rollout(m["id"], m["group_key"], m["study_name"], m["trial"], load(m["flags"]), load(m["certificate"]),
                   m["tuned_by"], m["state"], m["canary_box"], m["reason"], m["created_at"], m["foreign_bytes"])


def latest(engine: Engine, group: str) -> Rollout | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(rollouts).where(rollouts.c.group_key == group)
                           .order_by(rollouts.c.id.desc()).limit(1)).first()
    return None if row is None else _rollout(row)


def publish(engine: Engine, group: str, tuned_by: str, flags: dict[str, Any], certificate: dict[str, Any] | None,
            study: str | None, trial: int | None, now: float, foreign_bytes: int | None = None) -> int:
    """A new winner for the group (the previous rollout, whatever its state, is superseded). The box that
    tuned it has deployed and verified it already: its adoption is recorded with it."""
    with engine.begin() as conn:
        conn.execute(rollouts.update().where(rollouts.c.group_key == group, rollouts.c.state.in_(IN_FLIGHT))
                     .values(state=SUPERSEDED, updated_at=now))
        rid = int(conn.execute(rollouts.insert().values(
            group_key=group, study_name=study, trial=trial, flags=dump(flags), certificate=dump(certificate),
            tuned_by=tuned_by, state=CANARY, foreign_bytes=foreign_bytes, created_at=now,
            updated_at=now)).inserted_primary_key[0])
        conn.execute(adoptions.insert().values(rollout_id=rid, box=tuned_by, state=ADOPTED, started_at=now,
                                               ended_at=now, reason="tuned it"))
    return rid


def adoption(engine: Engine, rollout_id: int, box: str) -> tuple[str, str | None, float | None] | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(adoptions.c.state, adoptions.c.reason, adoptions.c.ended_at).where(
            adoptions.c.rollout_id == rollout_id, adoptions.c.box == box)).first()
    return None if row is None else (row[0], row[1], row[2])


def next_step(engine: Engine, group: str, box: str, healthy_s: float, stale_s: float, now: float) -> Step | None:
    """This box's part in its group's rollout, if it has one now (None: no rollout in flight, or this box
    has adopted it, failed it, or tuned it)."""
    r = latest(engine, group)
    if r is None or r.state not in IN_FLIGHT or adoption(engine, r.id, box) is not None:
        return None
    if r.canary_box is None:
        with engine.begin() as conn:
            won = conn.execute(rollouts.update().where(rollouts.c.id == r.id, rollouts.c.canary_box.is_(None))
                               .values(canary_box=box, updated_at=now)).rowcount
        if won == 1:
            return Step(r, True, True, f"canary for the group's winner (tuned by {r.tuned_by})")
        r = latest(engine, group) or r
    if r.canary_box == box:
        return Step(r, True, True, "canary")
    assert r.canary_box is not None
    canary = adoption(engine, r.id, r.canary_box)
    if canary is None or canary[0] == ADOPTING or canary[2] is None:
        return Step(r, False, False, f"waiting for the canary {r.canary_box} to adopt")
    with engine.connect() as conn:
        health = conn.execute(sa.select(boxes.c.healthy, boxes.c.seen_at).where(boxes.c.box == r.canary_box)).first()
    if health is None or not health[0]:
        halt(engine, r.id, f"the canary {r.canary_box} is not serving healthily after adopting", now)
        return None
    if now - health[1] > stale_s:
        return Step(r, False, False, f"the canary {r.canary_box} has not reported for {now - health[1]:.0f} s")
    served = now - canary[2]
    if served < healthy_s:
        return Step(r, False, False, f"the canary {r.canary_box} has served it for {served:.0f} of {healthy_s:.0f} s")
    if r.state == CANARY:
        with engine.begin() as conn:
            conn.execute(rollouts.update().where(rollouts.c.id == r.id, rollouts.c.state == CANARY)
                         .values(state=ROLLING, updated_at=now))
    return Step(r, True, False, f"the canary {r.canary_box} served it healthily for {served:.0f} s")


def start(engine: Engine, rollout_id: int, box: str, now: float) -> bool:
    """This box begins adopting (False: it already has, from an earlier cycle)."""
    try:
        with engine.begin() as conn:
            conn.execute(adoptions.insert().values(rollout_id=rollout_id, box=box, state=ADOPTING, started_at=now))
    except IntegrityError:
        return False
    return True


def decline(engine: Engine, rollout_id: int, box: str, reason: str, now: float) -> bool:
    """This box will not adopt the winner and tunes for itself (the rollout goes on without it). False: it
    already answered this rollout."""
    try:
        with engine.begin() as conn:
            conn.execute(adoptions.insert().values(rollout_id=rollout_id, box=box, state=RETUNED, reason=reason,
                                                   started_at=now, ended_at=now))
    except IntegrityError:
        return False
    return True


def finish(engine: Engine, rollout_id: int, box: str, ok: bool, reason: str | None, now: float) -> None:
    """The box's adoption ended: served and verified, or failed (its config kept) — then the group stops."""
    with engine.begin() as conn:
        conn.execute(adoptions.update().where(adoptions.c.rollout_id == rollout_id, adoptions.c.box == box)
                     .values(state=ADOPTED if ok else FAILED, reason=reason, ended_at=now))
    if not ok:
        halt(engine, rollout_id, f"{box}: {reason}", now)


def halt(engine: Engine, rollout_id: int, reason: str, now: float) -> None:
    with engine.begin() as conn:
        conn.execute(rollouts.update().where(rollouts.c.id == rollout_id, rollouts.c.state.in_(IN_FLIGHT))
                     .values(state=HALTED, reason=reason, updated_at=now))
