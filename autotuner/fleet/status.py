"""What `autotuner fleet status` prints and each daemon's `/status` carries under `fleet`: the groups, the
box that tuned for each (or tunes now, and until when its lease runs), each box's deployed config and
certificate, and the rollouts in flight with every box's adoption. Read from the database alone, so it
says the same from any box or none."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from autotuner.fleet import lease, membership
from autotuner.fleet.rollout import IN_FLIGHT
from autotuner.fleet.tables import adoptions, claims, load, rollouts
from autotuner.secrets import redact_value


def _claim_doc(c: lease.Claim | None, now: float) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"box": c.holder, "state": c.state, "study": c.study_name, "lease_left_s": round(c.expires_at - now, 1),
            "taken_over_from": c.taken_over_from, "reason": c.reason}


def _rollouts(engine: Engine, group: str, limit: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(rollouts).where(rollouts.c.group_key == group)
                            .order_by(rollouts.c.id.desc()).limit(limit)).all()
        out = []
        for r in (row._mapping for row in rows):
            boxes = conn.execute(sa.select(adoptions).where(adoptions.c.rollout_id == r["id"])
                                 .order_by(adoptions.c.started_at)).all()
            out.append({"id": r["id"], "state": r["state"], "in_flight": r["state"] in IN_FLIGHT,
                        "tuned_by": r["tuned_by"], "canary": r["canary_box"], "study": r["study_name"],
                        "trial": r["trial"], "flags": load(r["flags"]), "reason": r["reason"],
                        "foreign_mib": None if r["foreign_bytes"] is None else round(r["foreign_bytes"] / 2**20),
                        "adoptions": [{"box": a["box"], "state": a["state"], "reason": a["reason"]}
                                      for a in (b._mapping for b in boxes)]})
    return out


def fleet_status(engine: Engine, group: str | None = None, now: float | None = None,
                 rollouts_per_group: int = 3) -> dict[str, Any]:
    now = time.time() if now is None else now
    if not sa.inspect(engine).has_table(claims.name):
        return {"groups": []}  # a storage no fleet daemon has used: read, never written to
    members = membership.members(engine, group)
    with engine.connect() as conn:
        query = sa.select(claims.c.group_key)
        known = {r[0] for r in conn.execute(query if group is None else query.where(claims.c.group_key == group))}
    groups = []
    for key in sorted({m.group_key for m in members} | known):
        boxes = [{"box": m.box, "healthy": m.healthy, "seen_s_ago": round(now - m.seen_at, 1),
                  "describe": m.describe, "live_flags": m.live_flags,
                  "certificate": m.certificate} for m in members if m.group_key == key]
        groups.append({"group": key, "boxes": boxes, "tuner": _claim_doc(lease.current(engine, key), now),
                       "rollouts": _rollouts(engine, key, rollouts_per_group)})
    return dict(redact_value({"groups": groups}))


def render(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for g in doc["groups"]:
        describe = next((b["describe"] for b in g["boxes"]), {}) or {}
        lines.append(f"group {g['group']}: {describe.get('model', '?')} on {describe.get('gpus', '?')}, "
                     f"vLLM {describe.get('engine', '?')}, {len(g['boxes'])} box(es)")
        tuner = g["tuner"]
        if tuner is not None:
            took = f", taken over from {tuner['taken_over_from']}" if tuner["taken_over_from"] else ""
            lines.append(f"  tuner: {tuner['box']} ({tuner['state']}, study {tuner['study'] or '-'}, lease "
                         f"{tuner['lease_left_s']:+.0f} s{took})")
        for b in g["boxes"]:
            cert = b["certificate"] or {}
            served = f"trial {cert.get('trial')} of study {cert.get('study')}" if cert else "its own config"
            lines.append(f"  box {b['box']}: {'healthy' if b['healthy'] else 'NOT healthy'}, seen "
                         f"{b['seen_s_ago']:.0f} s ago, runs {served}: {b['live_flags']}")
        for r in g["rollouts"]:
            who = ", ".join(f"{a['box']} {a['state']}" for a in r["adoptions"])
            why = f" — {r['reason']}" if r["reason"] else ""
            lines.append(f"  rollout {r['id']} ({r['state']}): trial {r['trial']} of {r['study']}, tuned by "
                         f"{r['tuned_by']}, canary {r['canary'] or '-'}; {who}{why}")
    return "\n".join(lines) if lines else "no fleet in this storage"
