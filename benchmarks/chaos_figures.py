"""The figures of benchmarks/daemon_chaos.py, computed from what the benchmark saw from outside the daemon:
its own /health samples of production, the faults it injected, the long prompts it sent, the OOMs it read in
production's log, and the daemon's database read after the run (cycles, transitions, refusals, soak trials).
Pure functions over those records, so that each figure says exactly what it counts."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# A cycle's steps during which production is down on purpose: from entering one of these until the cycle
# leaves them (a tune after a drain keeps it down: those cycles enter `drain` first).
PLANNED_FROM = ("drain", "deploy", "rollback")
PLANNED_UNTIL = ("done", "window", "proposed")
# After a step ends, production's own /health may take one of our samples to agree.
SAMPLE_SLACK_S = 0.5


@dataclass(frozen=True)
class Sample:
    at: float
    up: bool


@dataclass(frozen=True)
class Outage:
    start: float  # first sample that saw production down
    end: float | None  # first sample that saw it up again (None: still down at the end)
    planned: bool  # began inside a planned step of a cycle

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True)
class Oom:
    at: float  # when the benchmark first read the OOM in production's log
    prompts: tuple[int, ...]  # the lengths of the crashing step's requests (vLLM's scheduler dump)


@dataclass
class Figures:
    cycles: int = 0
    faults: int = 0
    run_s: float = 0.0
    unplanned_down_s: float = 0.0
    planned_down_s: float = 0.0
    cycles_ending_down: list[int] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    redeployed_refused: list[int] = field(default_factory=list)  # cycles, same fingerprint
    redeployed_refused_any: list[int] = field(default_factory=list)  # cycles, same flags, any fingerprint
    drift_triggers: int = 0
    drift_false: list[float] = field(default_factory=list)
    ooms: int = 0
    oom_replayed: list[bool] = field(default_factory=list)
    oom_notes: list[str] = field(default_factory=list)

    @property
    def unplanned_share(self) -> float:
        return self.unplanned_down_s / self.run_s if self.run_s else 0.0

    @property
    def max_to_serving_s(self) -> float:
        closed = [o.seconds for o in self.outages if not o.planned and o.seconds is not None]
        open_ = [self.run_s for o in self.outages if not o.planned and o.end is None]
        return max([*closed, *open_], default=0.0)


def planned_intervals(transitions: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) of every stretch a cycle had production down on purpose, from its transition rows
    (cycle_id, at, to_state), in order. A stretch still open at the end runs to infinity."""
    out: list[tuple[float, float]] = []
    opened: dict[int, float] = {}
    for t in sorted(transitions, key=lambda r: r["at"]):
        cid, state, at = t["cycle_id"], t["to_state"], t["at"]
        if state in PLANNED_FROM and cid not in opened:
            opened[cid] = at
        elif state in PLANNED_UNTIL and cid in opened:
            out.append((opened.pop(cid), at + SAMPLE_SLACK_S))
    out += [(start, float("inf")) for start in opened.values()]
    return out


def _inside(at: float, intervals: Sequence[tuple[float, float]]) -> bool:
    return any(a <= at <= b for a, b in intervals)


def outages(samples: Sequence[Sample], planned: Sequence[tuple[float, float]]) -> list[Outage]:
    out: list[Outage] = []
    start: float | None = None
    for s in samples:
        if not s.up and start is None:
            start = s.at
        elif s.up and start is not None:
            out.append(Outage(start, s.at, _inside(start, planned)))
            start = None
    if start is not None:
        out.append(Outage(start, None, _inside(start, planned)))
    return out


def downtime(samples: Sequence[Sample], planned: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(unplanned, planned) seconds production answered no 200, from consecutive samples: the stretch
    before a down sample counts as down."""
    unplanned = planned_s = 0.0
    for prev, s in itertools.pairwise(samples):
        if s.up:
            continue
        dt = s.at - prev.at
        if _inside(s.at, planned):
            planned_s += dt
        else:
            unplanned += dt
    return unplanned, planned_s


def ending_down(cycles: Sequence[dict[str, Any]], samples: Sequence[Sample], crash_faults: Sequence[float],
                within_s: float = 2.0) -> list[int]:
    """Cycles after whose end production did not answer 200 once in `within_s`, unless the benchmark
    itself crashed production just then."""
    out = []
    for c in cycles:
        end = c.get("ended_at")
        if end is None:
            continue
        seen = [s for s in samples if end <= s.at <= end + within_s]
        if not seen or any(s.up for s in seen):
            continue
        if any(end - 3.0 <= f <= end + within_s for f in crash_faults):
            continue
        out.append(int(c["id"]))
    return out


def flags_key(flags: dict[str, Any]) -> str:
    return json.dumps(flags, sort_keys=True, default=str)


def redeployed(cycles: Sequence[dict[str, Any]], deploy_at: dict[int, float], refusals: Sequence[dict[str, Any]],
               fingerprint_of: Any) -> tuple[list[int], list[int]]:
    """Cycles that deployed a config refused by production before that deploy: (same fingerprint as the
    refusal, any fingerprint)."""
    same, any_fp = [], []
    for c in cycles:
        at = deploy_at.get(int(c["id"]))
        if at is None or not c.get("candidate_flags"):
            continue
        key = flags_key(json.loads(c["candidate_flags"]))
        before = [r for r in refusals if r["flags_key"] == key and r["first_at"] < at]
        if before:
            any_fp.append(int(c["id"]))
            fp = fingerprint_of(c)
            if fp is not None and any(r["fingerprint"] == fp for r in before):
                same.append(int(c["id"]))
    return same, any_fp


def drift_false(trigger_times: Sequence[float], long_traffic: Sequence[tuple[float, float]], window_s: float,
                slack_s: float = 3.0) -> list[float]:
    """Drift triggers with no long production prompt (ours: drift and OOM faults) in the window before."""
    return [t for t in trigger_times
            if not any(s <= t and e >= t - window_s - slack_s for s, e in long_traffic)]


def replayed(oom: Oom, cycle: dict[str, Any] | None, soak_prompt: int | None, cap: int) -> tuple[bool, str]:
    """Did the first cycle after the OOM tune for its prompts (`include_prompt_tokens` holding every
    length of the crashing step, cut to what the context holds) and soak at least the longest of them?"""
    want = sorted((min(n, cap) for n in oom.prompts), reverse=True)
    if cycle is None:
        return False, "no cycle started after it"
    changes = (json.loads(cycle["scenario"] or "{}") or {}).get("changes") or {}
    included = list(changes.get("workload.requests.include_prompt_tokens") or [])
    missing = list(want)
    for n in included:
        if n in missing:
            missing.remove(n)
    if missing:
        return False, (f"cycle {cycle['id']} ({cycle['trigger_kind']}) replays {sorted(included, reverse=True)[:8]}"
                       f", not {missing[:8]}")
    if not want:
        return False, "the log had no scheduler dump for it"
    if soak_prompt is None or soak_prompt < want[0]:
        return False, f"cycle {cycle['id']} included them but its soak ran prompts of {soak_prompt} tokens"
    return True, f"cycle {cycle['id']} replayed {want[:8]}, soaked at {soak_prompt} tokens"
