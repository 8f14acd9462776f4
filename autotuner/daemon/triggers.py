"""What makes the daemon re-tune, each with its evidence: production compared with the reference (what it
was when last tuned or adopted), with its own recent past (crash, restart, KV pressure, drift over a sliding
window) and with the clock (schedule). Probes come from `autotuner.watch`; nothing here talks HTTP.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotuner.daemon.config import TriggerSettings
from autotuner.scenario import Scenario
from autotuner.watch.drift import context_of, prompt_drift
from autotuner.watch.oom import oom_lines
from autotuner.watch.scheduler_dump import CrashStep, crash_steps
from autotuner.watch.served import ServedWindow, same_lifetime, served_window
from autotuner.watch.snapshot import GpuInfo, LengthHistogram, ProductionSnapshot

MODEL_SWAP, ENGINE_UPGRADE, GPU_CHANGE, DRIFT, OOM, CRASH, KV_PRESSURE, SCHEDULE = (
    "model-swap", "engine-upgrade", "gpu-change", "workload-drift", "production-oom", "production-crash",
    "kv-pressure", "schedule")
# Triggers whose re-tune should use the lengths production actually saw.
OBSERVED_LENGTHS = (DRIFT, OOM, CRASH, KV_PRESSURE)
# KV cache this full, with preemptions climbing over this many polls in a row: the config is too tight.
KV_PINNED = 0.98
KV_POLLS = 3
_LOG_TAIL_BYTES = 1 << 20
# A request's lengths reach /metrics when it finishes, about when its response ends: a snapshot taken this
# soon after our own traffic ended may still be missing its last requests, so it is no baseline yet.
OWN_TRAFFIC_SETTLE_S = 1.0
# How far back the served window reaches (the twin's evidence of the config production runs, served.py).
SERVED_WINDOW_S = 900.0
# The crashing steps' lengths a trigger carries at most (a step schedules up to max-num-seqs requests).
CRASH_PROMPTS_MAX = 512


@dataclass(frozen=True)
class Trigger:
    kind: str
    evidence: dict[str, Any]


def identity(snapshot: ProductionSnapshot, gpus: tuple[GpuInfo, ...]) -> dict[str, Any]:
    """What production is: the yardstick stored as the reference after a cycle (or at adoption)."""
    return {"model_fingerprint": snapshot.model_fingerprint, "served_model": snapshot.served_model,
            "root": snapshot.root, "max_model_len": snapshot.max_model_len, "vllm_version": snapshot.vllm_version,
            "gpus": [[g.uuid, g.memory_total_mib] for g in gpus],
            "gpu_names": [g.name for g in gpus]}


def histogram_dict(h: LengthHistogram | None) -> dict[str, Any] | None:
    """As JSON holds it: the last bucket's bound is "+Inf", as in the Prometheus text (JSON has no infinity)."""
    return None if h is None else h.as_dict()


def histogram_of(data: dict[str, Any] | None) -> LengthHistogram | None:
    return LengthHistogram.from_dict(data) if data else None


@dataclass
class TriggerWatch:
    """The triggers' memory between polls (in memory: after a restart the windows start again)."""

    settings: TriggerSettings
    log_path: Path | None = None
    history: deque[tuple[float, LengthHistogram]] = field(default_factory=deque)
    last: ProductionSnapshot | None = None
    last_reachable: ProductionSnapshot | None = None
    kv_climb: int = 0
    log_offset: int | None = None
    down_since: float | None = None  # production unreachable since (a restart by a person is short)
    down_fired: bool = False
    # Scheduler dumps read from the log and not yet reported: the dump comes before the OOM line, and a poll
    # can fall between them.
    crashes: list[CrashStep] = field(default_factory=list)
    # No drift baseline is taken before this time: until then production's counts hold our own traffic.
    quiet_after: float | None = None
    # Production's recent snapshots of one lifetime and model, oldest first: its served window.
    served: deque[ProductionSnapshot] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.log_offset = self._log_size()  # OOMs before we started are not news

    def _log_size(self) -> int | None:
        try:
            return self.log_path.stat().st_size if self.log_path is not None else None
        except OSError:
            return None

    def new_log_ooms(self) -> list[str]:
        """The OOM lines logged since the last read; the scheduler dumps among them join `crashes`."""
        text = self._new_log_text()
        self.crashes += crash_steps(text)
        return oom_lines(text)

    def _new_log_text(self) -> str:
        if self.log_path is None:
            return ""
        size = self._log_size()
        if size is None:
            return ""
        start = self.log_offset or 0
        if size < start:  # rotated or truncated: read the new file from its start
            start = 0
        start = max(start, size - _LOG_TAIL_BYTES)
        try:
            with self.log_path.open("rb") as f:
                f.seek(start)
                text = f.read(size - start).decode(errors="replace")
        except OSError:
            return ""
        self.log_offset = size
        return text

    def forget(self, restarted: bool = True) -> None:
        """After a cycle changed production: its past is another config's. `restarted=False` (the cycle
        never restarted production): what production logged meanwhile (an OOM) is still news."""
        self.history.clear()
        self.served.clear()
        self.last = None
        self.kv_climb = 0
        self.down_since, self.down_fired = None, False
        if restarted:
            self.log_offset = self._log_size()
            self.crashes.clear()

    def own_traffic(self, start_s: float, end_s: float) -> None:
        """The daemon sent production requests of its own (verify, a soak) from `start_s` to `end_s`
        (time.time()): they are in production's cumulative histogram, and no drift window may hold them.
        Every baseline taken before they ended is dropped, and none is taken until they have settled: the
        next window starts after `end_s`."""
        if end_s < start_s:
            raise ValueError(f"own traffic ends ({end_s}) before it starts ({start_s})")
        settled = end_s + OWN_TRAFFIC_SETTLE_S
        self.quiet_after = settled if self.quiet_after is None else max(self.quiet_after, settled)
        while self.history and self.history[0][0] < settled:
            self.history.popleft()
        while self.served and self.served[0].taken_at < settled:
            self.served.popleft()

    def observe(self, snap: ProductionSnapshot, gpus: tuple[GpuInfo, ...], ref: dict[str, Any] | None,
                scenario: Scenario, last_cycle_at: float | None, now: float | None = None) -> list[Trigger]:
        """The triggers this poll fires, in order of weight (a swap first: it makes the rest moot)."""
        now = time.time() if now is None else now
        s = self.settings
        fired: list[Trigger] = []
        if ref is not None and snap.reachable:
            if s.model_swap and ref.get("model_fingerprint") and snap.model_fingerprint \
                    and snap.model_fingerprint != ref["model_fingerprint"]:
                fired.append(Trigger(MODEL_SWAP, {"before": ref.get("model_fingerprint"),
                                                  "after": snap.model_fingerprint, "served_model": snap.served_model,
                                                  "root": snap.root, "was": ref.get("root")}))
            if s.engine_upgrade and ref.get("vllm_version") and snap.vllm_version \
                    and snap.vllm_version != ref["vllm_version"]:
                fired.append(Trigger(ENGINE_UPGRADE, {"before": ref["vllm_version"], "after": snap.vllm_version}))
        if ref is not None and s.gpu_change and gpus:
            now_gpus = [[g.uuid, g.memory_total_mib] for g in gpus]
            if ref.get("gpus") and now_gpus != ref["gpus"]:
                fired.append(Trigger(GPU_CHANGE, {"before": ref["gpus"], "after": now_gpus}))
        if s.production_oom:
            fired += self._health(snap, now, scenario.engine.startup_timeout_s)
        if s.workload_drift is not None and snap.reachable and snap.prompt_tokens is not None:
            fired += self._drift(snap, snap.prompt_tokens, scenario, now)
        if s.schedule is not None and last_cycle_at is not None and now - last_cycle_at >= s.schedule.every:
            fired.append(Trigger(SCHEDULE, {"every_s": s.schedule.every, "last_cycle_at": last_cycle_at}))
        self.last = snap
        if snap.reachable:
            self.last_reachable = snap
            self._keep_served(snap, now)
        return fired

    def _keep_served(self, snap: ProductionSnapshot, now: float) -> None:
        if self.quiet_after is not None and now < self.quiet_after:
            return  # our own requests may still be arriving in these counts
        if self.served and not same_lifetime(self.served[0], snap):
            self.served.clear()  # a restart or another model since the oldest: its window starts now
        self.served.append(snap)
        while len(self.served) > 2 and self.served[1].taken_at <= now - SERVED_WINDOW_S:
            self.served.popleft()

    def served_window(self) -> ServedWindow | None:
        """What production served over the last SERVED_WINDOW_S (None: not enough of it, in one lifetime)."""
        return served_window(self.served[0], self.served[-1]) if len(self.served) > 1 else None

    def _health(self, snap: ProductionSnapshot, now: float, grace_s: float) -> list[Trigger]:
        fired = []
        lines = self.new_log_ooms()
        if lines:
            fired.append(Trigger(OOM, {"log": str(self.log_path), "lines": lines[-5:], "count": len(lines),
                                       **self._observed(), **self._crashed()}))
        prev = self.last
        if snap.reachable:
            self.down_since, self.down_fired = None, False
        elif self.down_since is None and prev is not None and prev.reachable:
            self.down_since = now
        # Down for longer than an engine may take to start: not a restart by a person, a crash.
        if self.down_since is not None and not self.down_fired and now - self.down_since >= grace_s and not lines:
            self.down_fired = True
            fired.append(Trigger(CRASH, {"error": snap.error, "down_s": round(now - self.down_since, 1),
                                         **self._observed(), **self._crashed()}))
        elif prev is not None and prev.reachable and snap.reachable and _went_back(prev, snap) and not lines:
            fired.append(Trigger(CRASH, {"error": "the service restarted (its request counters went back to zero)",
                                         **self._observed(), **self._crashed()}))
        if snap.reachable and snap.kv_cache_usage is not None and snap.preemptions_total is not None \
                and prev is not None and prev.preemptions_total is not None:
            climbing = snap.kv_cache_usage >= KV_PINNED and snap.preemptions_total > prev.preemptions_total
            self.kv_climb = self.kv_climb + 1 if climbing else 0
            if self.kv_climb >= KV_POLLS:
                fired.append(Trigger(KV_PRESSURE, {"kv_cache_usage": snap.kv_cache_usage,
                                                   "preemptions_total": snap.preemptions_total,
                                                   "polls": self.kv_climb, **self._observed()}))
                self.kv_climb = 0
        return fired

    def _observed(self) -> dict[str, Any]:
        """The lengths production served before it failed: what the re-tune must survive, with the context
        that bounds the histogram's +Inf bucket."""
        snap = self.last_reachable
        return {"prompt_tokens": histogram_dict(snap.prompt_tokens if snap else None),
                "generation_tokens": histogram_dict(snap.generation_tokens if snap else None),
                "max_model_len": snap.max_model_len if snap else None}

    def _crashed(self) -> dict[str, Any]:
        """The requests of the steps that killed the engine, from vLLM's scheduler dump (none when the log
        holds no dump): their lengths, longest first, and the largest step's scheduled tokens. Reported once."""
        if not self.crashes:
            return {}
        steps, self.crashes = self.crashes, []
        lengths = sorted((n for step in steps for n in step.prompt_lengths), reverse=True)[:CRASH_PROMPTS_MAX]
        totals = [step.total_scheduled_tokens for step in steps if step.total_scheduled_tokens is not None]
        return {"crash_prompts": lengths, "crash_step_tokens": max(totals) if totals else sum(lengths),
                "crash_steps": len(steps)}

    def _drift(self, snap: ProductionSnapshot, hist: LengthHistogram, scenario: Scenario,
               now: float) -> list[Trigger]:
        """`scenario` is what production was last tuned for (the cycle's, not the configured one): drift is
        production moving away from what the config was chosen under.

        A window is the difference between two snapshots, the older one a baseline taken after our own
        traffic ended: the cumulative counts since the engine started are never a window (they hold the
        daemon's verify and soak prompts, and whatever came before the config now served)."""
        d = self.settings.workload_drift
        assert d is not None
        if self.quiet_after is not None and now < self.quiet_after:
            return []  # our own requests may still be arriving in these counts: not a baseline
        if self.history and hist.count < self.history[-1][1].count:
            self.history.clear()  # the service restarted: its counters began again
        self.history.append((now, hist))
        while len(self.history) > 1 and self.history[1][0] <= now - d.window_s:
            self.history.popleft()
        if len(self.history) < 2:
            return []
        window = hist.since(self.history[0][1])
        if window is hist or window.count < d.min_requests:  # since() gave up on the baseline: not a window
            return []
        context = snap.max_model_len or context_of(scenario)
        drift = prompt_drift(scenario, window, min_requests=d.min_requests, max_model_len=context)
        if drift is None or drift.ratio < d.p95_ratio:
            return []
        self.history.clear()  # once per window of evidence: the next one starts here
        self.history.append((now, hist))
        return [Trigger(DRIFT, {"p95_scenario": drift.p95_scenario, "p95_production": drift.p95_production,
                                "ratio": drift.ratio, "requests": drift.requests, "threshold": d.p95_ratio,
                                "window_s": d.window_s, "prompt_tokens": histogram_dict(window),
                                "max_model_len": context,
                                "generation_tokens": histogram_dict(self.last_reachable.generation_tokens
                                                                    if self.last_reachable else None)})]


def _went_back(prev: ProductionSnapshot, snap: ProductionSnapshot) -> bool:
    a, b = prev.prompt_tokens, snap.prompt_tokens
    return a is not None and b is not None and b.count < a.count
