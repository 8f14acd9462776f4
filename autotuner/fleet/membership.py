"""A box's row in the fleet: which group it belongs to (boxes whose model, GPU inventory, engine version
and workload fingerprint agree), what it runs, and whether production answered at its last poll. The
keys come from production's identity as the daemon observes it (group_keys)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from autotuner.fleet.tables import boxes, claims, dump, load
from autotuner.scenario import Scenario


@dataclass(frozen=True)
class Member:
    box: str
    group_key: str
    family_key: str
    deployment: str
    describe: dict[str, Any]
    live_flags: dict[str, Any] | None
    certificate: dict[str, Any] | None
    healthy: bool
    seen_at: float


def heartbeat(engine: Engine, member: Member) -> None:
    """One write per poll: the box's row, inserted the first time (only the box itself writes it)."""
    values = {"group_key": member.group_key, "family_key": member.family_key, "deployment": member.deployment,
              "describe": dump(member.describe), "live_flags": dump(member.live_flags),
              "certificate": dump(member.certificate), "healthy": member.healthy, "seen_at": member.seen_at}
    with engine.begin() as conn:
        if not conn.execute(boxes.update().where(boxes.c.box == member.box).values(**values)).rowcount:
            conn.execute(boxes.insert().values(box=member.box, **values))


def members(engine: Engine, group: str | None = None) -> list[Member]:
    query = sa.select(boxes).order_by(boxes.c.group_key, boxes.c.box)
    if group is not None:
        query = query.where(boxes.c.group_key == group)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [Member(m["box"], m["group_key"], m["family_key"], m["deployment"], load(m["describe"]),
                   load(m["live_flags"]), load(m["certificate"]), bool(m["healthy"]), m["seen_at"])
            for m in (r._mapping for r in rows)]


def family_study(engine: Engine, family: str, group: str) -> str | None:
    """The newest study of a related group (same model, engine and workload, other GPUs): a box whose
    hardware differs never adopts its winner, but starts its own search from that study's best."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(claims.c.study_name).where(
            claims.c.family_key == family, claims.c.group_key != group, claims.c.study_name.is_not(None))
            .order_by(claims.c.claimed_at.desc()).limit(1)).first()
    return None if row is None else str(row[0])


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def group_keys(identity: dict[str, Any], scenario: Scenario) -> tuple[str, str, dict[str, Any]]:
    """A box's group, its family and a description, from production's identity (daemon/triggers.py) and
    the scenario it is tuned for. The GPUs count by model and memory, never by UUID: identical boxes hold
    different cards of the same kind. The family leaves the GPUs out."""
    names = identity.get("gpu_names") or []
    memory = [g[1] if isinstance(g, list | tuple) and len(g) > 1 else None for g in identity.get("gpus") or []]
    gpus = sorted(f"{name} ({mib} MiB)" for name, mib in zip(names, memory, strict=False))
    model = identity.get("model_fingerprint") or identity.get("root")
    workload = scenario.workload.requests.model_dump(mode="json")
    family = _digest({"model": model, "engine": identity.get("vllm_version"), "workload": workload})
    describe = {"model": identity.get("root") or identity.get("served_model"), "engine": identity.get("vllm_version"),
                "gpus": ", ".join(gpus) or "no GPU seen", "workload": _digest(workload)}
    return _digest({"family": family, "gpus": gpus}), family, describe
