"""What `GET /status` answers and `autotuner daemon status` prints: read from the database, so that both say
the same thing whether or not the daemon is running."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.state import DEPLOYED, DONE, ROLLED_BACK, CycleStore


def _when(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def _cycle(c: Any) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"id": c.id, "state": c.state, "outcome": c.outcome, "reason": c.reason, "trigger": c.trigger_kind,
            "study": c.study_name, "warm_start": c.warm_start, "trials": c.trials,
            "candidate_trial": c.candidate_trial, "downtime_s": round(c.downtime_s, 3),
            "started_at": _when(c.started_at), "ended_at": _when(c.ended_at)}


def status_document(states: CycleStore, config: DaemonConfig, runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    cycles = states.cycles(limit=50)
    current = next((c for c in cycles if c.state != DONE), None)
    last = next((c for c in cycles if c.state == DONE), None)
    deployed = states.last_deployed()
    triggers = states.events(kind="trigger", limit=1)
    counts = states.counts()
    started = [c.started_at for c in cycles]
    earliest = (max(started) + config.min_interval_s) if started else time.time()
    window = config.schedule_window
    if window is not None:
        opens = window.next_open(datetime.fromtimestamp(max(earliest, time.time())).astimezone())
        earliest = max(earliest, opens.timestamp())
    scheduled = (max(started) + config.triggers.schedule.every) if started and config.triggers.schedule else None
    live = deployed.candidate_flags if deployed is not None else None
    doc: dict[str, Any] = {
        "deployment": states.deployment,
        "state": current.state if current is not None else "idle",
        "cycle": _cycle(current),
        "deployed": None if deployed is None else {
            "flags": live, "study": deployed.study_name, "trial": deployed.candidate_trial,
            "certificate": deployed.certificate, "since": _when(deployed.ended_at)},
        "last_cycle": _cycle(last),
        "next_cycle": {"earliest_at": _when(earliest), "scheduled_at": _when(scheduled),
                       "window": config.window, "min_interval_s": config.min_interval_s},
        "last_trigger": None if not triggers else {"at": _when(triggers[0].at), **triggers[0].detail},
        "counts": {"cycles": counts["cycles"], "trials": counts["trials"],
                   "deployed": counts.get(DEPLOYED, 0), "rollbacks": counts.get(ROLLED_BACK, 0)},
        "reference": states.reference(),
    }
    if runtime:
        doc.update(runtime)
    return doc


def status_lines(doc: dict[str, Any]) -> list[str]:
    """The same facts, for a person."""
    out = [f"deployment {doc['deployment']}: {doc['state']}"]
    c = doc.get("cycle")
    if c:
        out.append(f"  cycle {c['id']} in flight: {c['state']} (trigger {c['trigger']}, since {c['started_at']})")
    d = doc.get("deployed")
    if d:
        flags = " ".join(f"{k}={v}" for k, v in (d["flags"] or {}).items())
        out.append(f"deployed: trial {d['trial']} of study {d['study']} since {d['since']}: {flags}")
        for line in (d.get("certificate") or {}).get("lines", [])[:6]:
            out.append(f"  {line}")
    else:
        out.append("deployed: nothing by the daemon yet (production runs its own config)")
    last = doc.get("last_cycle")
    if last:
        out.append(f"last cycle {last['id']}: {last['outcome']} (trigger {last['trigger']}, {last['trials'] or 0} "
                   f"trials, downtime {last['downtime_s']:.1f} s, ended {last['ended_at']})"
                   + (f": {last['reason']}" if last.get("reason") else ""))
    t = doc.get("last_trigger")
    if t:
        out.append(f"last trigger: {t.get('kind')} at {t['at']} ({t.get('action', '')})")
    n = doc["next_cycle"]
    out.append(f"next cycle: not before {n['earliest_at']}" + (f", scheduled {n['scheduled_at']}"
                                                                   if n.get("scheduled_at") else "")
               + (f", window {n['window']}" if n.get("window") else ""))
    k = doc["counts"]
    out.append(f"cycles {k['cycles']}, deployed {k['deployed']}, rollbacks {k['rollbacks']}, trials {k['trials']}")
    return out
