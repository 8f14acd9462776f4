"""What `GET /status` answers and `autotuner daemon status` prints: read from the database (and the live
config file, and production itself where the caller has a snapshot), so that both say the same thing
whether or not the daemon is running — and say so when it is not.

The document is masked as a whole before it is returned (secrets.redact_value): production's endpoint
may carry a password (http://user:pw@host), an engine's reason may quote a secret."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from autotuner.analysis.wording import shorten
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.refusals import Refusals, backoff_s
from autotuner.daemon.runtime import RuntimeStore
from autotuner.daemon.state import DEPLOYED, DONE, PROPOSED, ROLLED_BACK, CycleStore
from autotuner.secrets import redact_value, remember_url_password


def _when(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


# Verify's figures put beside the certificate's: (metric, name, unit, digits).
VERIFIED = (("output_tokens_per_s", "output", "tok/s", 1), ("ttft_p95_s", "TTFT p95", "s", 3))


def certificate_figures(certificate: Any, selection: Any) -> dict[str, Any]:
    """The certificate's figures a later verify is compared with: means, their 95 % intervals, the range
    one more run falls in (95 %), their units."""
    c = selection.confirmation
    compared = [metric for metric, *_ in VERIFIED]
    return {"metrics": {k: certificate.metrics.get(k) for k in compared},
            "intervals": {k: vars(iv) for k, iv in (c.intervals.items() if c is not None else ()) if k in compared},
            "next_run": {k: vars(iv) for k, iv in (c.next_run.items() if c is not None else ()) if k in compared},
            "basis": certificate.basis,
            "comparison": certificate.comparisons[0]["sentence"] if certificate.comparisons else None}


def verify_figures(certificate: dict[str, Any] | None, measured: dict[str, Any] | None,
                   production_speedup: float | None = None) -> dict[str, Any] | None:
    """Production's verify run in the certificate's units, compared with the certificate.

    Verify times production by the wall clock. When production is `autotuner sim serve` at speed-up S,
    its wall clock runs S times faster than the simulated hardware the certificate's figures are in:
    throughput is divided by S and latencies multiplied before they are compared with the
    certificate. Verify is one run: it is held against the range one more run of the certified config
    falls in (95 %, from the confirmation's spread), within it or above or below it, never against the
    mean's interval (a single run falls outside that one often with nothing wrong) and never "+x %
    better". A certificate from before that range was kept shows its mean only."""
    if not measured:
        return None
    cert = certificate or {}
    scale = float(production_speedup or 1.0)
    figures: dict[str, Any] = {}
    sentences = []
    for metric, name, unit, digits in VERIFIED:
        value = measured.get(metric)
        if not isinstance(value, int | float):
            continue
        converted = value / scale if metric.endswith("per_s") else value * scale
        iv = (cert.get("intervals") or {}).get(metric)
        ahead = (cert.get("next_run") or {}).get(metric)
        mean = (cert.get("metrics") or {}).get(metric)
        figures[metric] = {"wall_clock": value, "in_certificate_units": round(converted, 6),
                           "certificate_mean": mean, "certificate_interval": iv, "certificate_next_run": ahead}
        text = f"{name} {converted:.{digits}f} {unit}"
        if ahead:
            where = ("within" if ahead["low"] <= converted <= ahead["high"] else
                     "above" if converted > ahead["high"] else "below")
            text += (f" ({where} the range one run of the certified config falls in, 95 %: "
                     f"{ahead['low']:.{digits}f}–{ahead['high']:.{digits}f}; mean {ahead['mean']:.{digits}f})")
        elif iv:
            text += f" (certificate: mean {iv['mean']:.{digits}f} of {iv['n']} runs)"
        elif isinstance(mean, int | float):
            text += f" (certificate: {mean:.{digits}f}, one run)"
        sentences.append(text)
    if not figures:
        return None
    basis = str(cert.get("basis") or "").split(";")[0]
    if scale != 1:
        how = f"one verify run, wall-clock figures of the simulator at speed-up {scale:g} converted to {basis}"
    else:
        how = "one verify run, wall-clock time" + (f" (the certificate is in {basis})" if "simulated" in basis
                                                   else "")
    return {"figures": figures, "units": how, "summary": f"{'; '.join(sentences)} — {how}"}


def _verified(states: CycleStore, cycle: Any) -> dict[str, Any] | None:
    """The deploying cycle's verify figures, from its last transition."""
    done = next((e for e in states.events(kind="transition", cycle_id=cycle.id, limit=20)
                 if e.to_state == DONE and e.detail.get("metrics")), None)
    if done is None:
        return None
    return verify_figures(cycle.certificate, done.detail.get("metrics"), done.detail.get("production_speedup"))


def _cycle(c: Any) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"id": c.id, "state": c.state, "outcome": c.outcome, "reason": c.reason, "trigger": c.trigger_kind,
            "study": c.study_name, "warm_start": c.warm_start, "trials": c.trials,
            "candidate_trial": c.candidate_trial, "candidate_flags": c.candidate_flags,
            "certificate": (c.certificate or {}).get("lines", [])[:6] if c.state == PROPOSED else None,
            "downtime_s": round(c.downtime_s, 3),
            "started_at": _when(c.started_at), "ended_at": _when(c.ended_at)}


def status_document(states: CycleStore, config: DaemonConfig, runtime: dict[str, Any] | None = None, *,
                    target: Any = None, runtime_store: RuntimeStore | None = None, refusals: Refusals | None = None,
                    snapshot: Any = None) -> dict[str, Any]:
    cycles = states.cycles(limit=50)
    current = next((c for c in cycles if c.state != DONE), None)
    last = next((c for c in cycles if c.state == DONE), None)
    deployed = states.last_deployed()
    triggers = states.events(kind="trigger", limit=1)
    counts = states.counts()
    failures = states.failures_in_a_row()
    started = [c.started_at for c in cycles]
    if failures and cycles:
        earliest = (cycles[0].ended_at or cycles[0].started_at) + backoff_s(config.min_interval_s, failures)
    else:
        earliest = (max(started) + config.min_interval_s) if started else time.time()
    window = config.schedule_window
    if window is not None:
        opens = window.next_open(datetime.fromtimestamp(max(earliest, time.time())).astimezone())
        earliest = max(earliest, opens.timestamp())
    scheduled = (max(started) + config.triggers.schedule.every) if started and config.triggers.schedule else None
    rt = runtime_store.get() if runtime_store is not None else None
    alive = rt.alive(config.triggers.poll_interval_s) if rt is not None else None
    if runtime:  # asked of the running daemon itself
        alive = True
    live = _live_flags(target)
    last_flags = deployed.candidate_flags if deployed is not None else None
    # "Deployed" is what runs: the last deploy only while the live file still holds it.
    still_live = deployed is not None and (live.get("flags") is None or live.get("flags") == last_flags)
    state = current.state if current is not None else "idle"
    if current is not None and current.state == PROPOSED:
        state = f"{PROPOSED} (waiting for `autotuner daemon approve` or `reject` of cycle {current.id})"
    elif current is not None and alive is False:
        state = f"{current.state} (interrupted: the daemon is not running; it resumes there at its next start)"
    doc: dict[str, Any] = {
        "deployment": states.deployment,
        "state": state,
        "daemon": None if rt is None else {
            "running": alive, "pid": rt.pid, "started_at": _when(rt.started_at),
            "heartbeat_at": _when(rt.heartbeat_at), "stopped_at": _when(rt.stopped_at)},
        "production": None if rt is None else {
            "up": rt.production_up, "since": _when(rt.production_since), "alarm": rt.alarm,
            "last_poll_success_at": _when(rt.last_poll_success_at),
            "downtime_s": {"planned": round(rt.downtime_planned_s, 1), "unplanned": round(rt.downtime_unplanned_s, 1)},
            "live_config": live, "served": _served(snapshot),
            "hand_edited": live.get("flags") is not None and rt.live_flags is not None
            and live.get("flags") != rt.live_flags},
        "cycle": _cycle(current),
        "deployed": None if deployed is None or not still_live else {
            "flags": last_flags, "study": deployed.study_name, "trial": deployed.candidate_trial,
            "certificate": deployed.certificate, "since": _when(deployed.ended_at),
            "verify": _verified(states, deployed)},
        "last_deploy": None if deployed is None else {
            "cycle": deployed.id, "trial": deployed.candidate_trial, "study": deployed.study_name,
            "since": _when(deployed.ended_at), "live": still_live},
        "last_cycle": _cycle(last),
        "next_cycle": {"earliest_at": _when(earliest), "scheduled_at": _when(scheduled),
                       "window": config.window, "min_interval_s": config.min_interval_s,
                       "failed_in_a_row": failures},
        "last_trigger": None if not triggers else {"at": _when(triggers[0].at), **triggers[0].detail},
        "counts": {"cycles": counts["cycles"], "trials": counts["trials"],
                   "deployed": counts.get(DEPLOYED, 0), "rollbacks": counts.get(ROLLED_BACK, 0)},
        "refused": [] if refusals is None else [
            {"flags": r.flags, "kind": r.kind, "reason": r.reason, "count": r.count, "last_at": _when(r.last_at)}
            for r in refusals.all(limit=10)],
        "reference": states.reference(),
    }
    if runtime:
        doc.update(runtime)
    remember_url_password(config.production.endpoint)  # masked bare too, e.g. inside a probe's error
    return redact_value(doc)  # type: ignore[no-any-return]


def _live_flags(target: Any) -> dict[str, Any]:
    if target is None:
        return {}
    try:
        return {"path": str(target.config_path), "flags": target.current()}
    except Exception as exc:  # unreadable or not YAML: say so, it is production's config
        return {"path": str(target.config_path), "flags": None, "error": str(exc)}


def _served(snapshot: Any) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    return {"reachable": snapshot.reachable, "model": snapshot.served_model, "root": snapshot.root,
            "vllm_version": snapshot.vllm_version, "max_model_len": snapshot.max_model_len,
            "error": snapshot.error, "at": _when(snapshot.taken_at)}


def status_lines(doc: dict[str, Any]) -> list[str]:
    """The same facts, for a person."""
    out = [f"deployment {doc['deployment']}: {doc['state']}"]
    dm = doc.get("daemon")
    if dm:
        out.append(f"daemon: {'running' if dm['running'] else 'NOT running'} (pid {dm['pid']}, last heartbeat "
                   f"{dm['heartbeat_at']}" + (f", stopped {dm['stopped_at']}" if dm.get("stopped_at") else "") + ")")
    p = doc.get("production")
    if p:
        up = {True: "up", False: "DOWN", None: "unknown"}[p["up"]]
        out.append(f"production: {up} since {p['since']}; downtime planned {p['downtime_s']['planned']:.0f} s, "
                   f"unplanned {p['downtime_s']['unplanned']:.0f} s")
        if p.get("alarm"):
            out.append(f"  ALARM: {p['alarm']}")
        served = p.get("served")
        if served and served.get("reachable"):
            out.append(f"  serves {served['model']} ({served['root']}), vLLM {served['vllm_version']}")
        live = p.get("live_config") or {}
        if live.get("flags") is not None:
            flags = " ".join(f"{k}={v}" for k, v in live["flags"].items())
            out.append(f"  live config {live['path']}: {flags}" + (" (edited by hand since the daemon wrote it)"
                                                                   if p.get("hand_edited") else ""))
    c = doc.get("cycle")
    if c:
        out.append(f"  cycle {c['id']} in flight: {c['state']} (trigger {c['trigger']}, since {c['started_at']})")
        if c["state"] == PROPOSED:
            flags = " ".join(f"{k}={v}" for k, v in (c.get("candidate_flags") or {}).items())
            out.append(f"  proposed: trial {c['candidate_trial']}: {flags}")
            out += [f"    {line}" for line in c.get("certificate") or []]
            out.append(f"  decide: autotuner daemon approve CONFIG {c['id']}  (or: autotuner daemon reject CONFIG "
                       f"{c['id']})")
    d = doc.get("deployed")
    ld = doc.get("last_deploy")
    if d:
        flags = " ".join(f"{k}={v}" for k, v in (d["flags"] or {}).items())
        out.append(f"deployed: trial {d['trial']} of study {d['study']} since {d['since']}: {flags}")
        for line in (d.get("certificate") or {}).get("lines", [])[:6]:
            out.append(f"  {line}")
        if d.get("verify"):
            out.append(f"  verified in production: {d['verify']['summary']}")
    elif ld:
        out.append(f"deployed: not the daemon's last deploy (cycle {ld['cycle']}, trial {ld['trial']}): production "
                   "now runs another config (a rollback or a hand edit since)")
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
               + (f", window {n['window']}" if n.get("window") else "")
               + (f" (backoff after {n['failed_in_a_row']} failed cycles)" if n.get("failed_in_a_row") else ""))
    for r in doc.get("refused") or []:
        flags = " ".join(f"{k}={v}" for k, v in r["flags"].items())
        out.append(f"refused ({r['kind']}, {r['count']}×, last {r['last_at']}): {flags}: {shorten(r['reason'], 160)}")
    k = doc["counts"]
    out.append(f"cycles {k['cycles']}, deployed {k['deployed']}, rollbacks {k['rollbacks']}, trials {k['trials']}")
    return out
