"""Stop a hopeless trial during its workload: it already misses an SLO by a wide margin, or it cannot
reach the SLO-feasible Pareto front any more.

The study builds a `Pruner` for each trial (`for_study`) and passes it down with the candidate
(`TrialRunner.run(..., pruner=)`); whoever runs the workload (the live replay in `replay_phase.py`, the
virtual-time evaluation in `runners.py`) builds a `Partial` from the requests finished so far and asks
`Pruner.check`; a reason means stop, outcome `pruned`, with the partial metrics kept. A pruned trial is
an engine run (it counts against the budget) and is never feasible.

What each rule claims:
- SLO miss: a latency percentile's certain lower bound. With n measured requests, the final p-th
  percentile (linear interpolation, `autotuner.stats.percentile`) is at least the value of rank
  n − ⌊p/100 · (n − 1)⌋ from the top, and the requests finished so far already hold that many values
  at least as large as the bound: no later request can lower it. Pruned when that bound is at least
  `SLO_MARGIN` × the limit.
- Pareto front: an optimistic bound on each objective — the certain bound above for latency
  percentiles; for throughputs an upper bound with one-sided confidence Φ(Z) ≈ 97.7 % (completions
  in a steady window counted as a Poisson process, relative spread 1/√k; tokens per request by their
  mean plus Z standard errors). Pruned when `keep` feasible trials are each at least as good as
  those bounds on every objective and better on one (`keep` = how many candidates confirmation
  re-measures: single shots are noisy, so the runners-up must finish too, or confirmation would have
  only the lucky best to re-measure). Not before `MIN_SHARE` of the requests finished.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import optuna
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.stats import percentile
from autotuner.trials.outcomes import TRUST_KINDS
from autotuner.trials.scoring import DEFAULT_TOP
from autotuner.workload.replay import CANCELLED, Replayer, ReplayResult

SLO_MARGIN = 1.25
Z = 2.0
MIN_SHARE = 0.25
MIN_DONE = 4
# How often the live replay asks (wall seconds).
CHECK_PERIOD_S = 0.25
_LATENCY = re.compile(r"^(ttft|tpot|e2e)_p(\d+)_s$")
_RATES = {"output_tokens_per_s": "output", "requests_per_s": "requests"}


@dataclass(frozen=True)
class Done:
    """One finished measured request; times in engine seconds from the start of the measured phase."""

    finished_s: float
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True)
class Partial:
    elapsed_s: float  # engine seconds since the measured phase began
    total: int  # measured requests in the whole workload
    done: Sequence[Done]

    def values(self, name: str) -> list[float]:
        return [v for d in self.done if d.ok and (v := getattr(d, f"{name}_s")) is not None]

    def metrics(self) -> dict[str, float | int | None]:
        """The measurements so far, under the names of the full run's metrics."""
        ok = [d for d in self.done if d.ok]
        span = max((d.finished_s for d in ok), default=self.elapsed_s) or None
        out: dict[str, float | int | None] = {
            "completed": len(ok), "failed": len(self.done) - len(ok), "duration_s": self.elapsed_s,
            "output_tokens_per_s": sum(d.output_tokens for d in ok) / span if span else 0.0,
            "requests_per_s": len(ok) / span if span else 0.0, "partial_of": self.total}
        for name in ("ttft", "tpot", "e2e"):
            for q in (50, 95, 99):
                out[f"{name}_p{q}_s"] = percentile(self.values(name), q)
        return out


@dataclass(frozen=True)
class FrontPoint:
    number: int
    values: dict[str, float]


class Pruner:
    def __init__(self, slos: Mapping[str, float], objectives: Sequence[tuple[str, str]],
                 front: Sequence[FrontPoint] = (), *, slo_margin: float = SLO_MARGIN, z: float = Z,
                 min_share: float = MIN_SHARE, keep: int = 1) -> None:
        self.slos = dict(slos)
        self.keep = max(1, keep)
        self.objectives = list(objectives)  # (metric, "maximize" | "minimize")
        self.front = list(front)
        self.slo_margin, self.z, self.min_share = slo_margin, z, min_share

    def check(self, partial: Partial) -> str | None:
        """Why the trial should stop now, or None."""
        for metric, limit in self.slos.items():
            low = certain_lower_bound(partial, metric)
            if low is not None and limit > 0 and low >= self.slo_margin * limit:
                return (f"pruned: {metric} is already at least {low:.3g} (SLO {limit:g}, margin "
                        f"{self.slo_margin:g}x) after {len(partial.done)}/{partial.total} requests")
        k = sum(d.ok for d in partial.done)
        if not self.front or k < max(MIN_DONE, math.ceil(self.min_share * partial.total)):
            return None
        bounds = {m: self.optimistic(partial, m, d) for m, d in self.objectives}
        better = [p.number for p in self.front if _dominates(p.values, bounds, self.objectives)]
        if len(better) >= self.keep:
            shown = ", ".join(f"{m} {'≤' if d == 'maximize' else '≥'} {bounds[m]:.4g}" for m, d in self.objectives)
            which = f"trial {better[0]} does" if len(better) == 1 else \
                f"trials {', '.join(map(str, better[:self.keep]))} do"
            return (f"pruned: cannot reach the Pareto front ({shown} at best, {_confidence(self.z):.1%} "
                    f"one-sided; {which} better) after {len(partial.done)}/{partial.total} requests")
        return None

    def optimistic(self, partial: Partial, metric: str, direction: str) -> float:
        """The best the full run can still show on `metric` (±inf when nothing bounds it)."""
        if direction == "minimize":
            low = certain_lower_bound(partial, metric)
            return -math.inf if low is None else low
        kind = _RATES.get(metric)
        ok = sorted((d for d in partial.done if d.ok), key=lambda d: d.finished_s)
        if kind is None or len(ok) < 3:
            return math.inf
        k = len(ok)
        window = ok[-1].finished_s - ok[0].finished_s
        if window <= 0:
            return math.inf
        rate_ub = (k - 1) / window * (1 + self.z / math.sqrt(k - 1))
        per = [float(d.output_tokens) if kind == "output" else 1.0 for d in ok]
        mean = sum(per) / k
        sd = math.sqrt(sum((p - mean) ** 2 for p in per) / (k - 1))
        per_ub = mean + self.z * sd / math.sqrt(k)
        left = max(0, partial.total - len(partial.done))
        amount = sum(per) + left * per_ub
        duration = max(partial.elapsed_s, ok[-1].finished_s) + left / rate_ub
        return amount / duration if duration > 0 else math.inf


def certain_lower_bound(partial: Partial, metric: str) -> float | None:
    """A latency percentile the full run cannot go below, from the requests finished so far."""
    match = _LATENCY.match(metric)
    if match is None:
        return None
    values = sorted(partial.values(match.group(1)), reverse=True)
    n = partial.total
    rank = n - math.floor(int(match.group(2)) / 100 * (n - 1))
    return values[rank - 1] if 0 < rank <= len(values) else None


def _dominates(values: Mapping[str, float], bounds: Mapping[str, float], objectives: Sequence[tuple[str, str]]) -> bool:
    strictly = False
    for metric, direction in objectives:
        v, b = values.get(metric), bounds[metric]
        if v is None or math.isnan(b):
            return False
        better = v > b if direction == "maximize" else v < b
        worse = v < b if direction == "maximize" else v > b
        if worse:
            return False
        strictly = strictly or better
    return strictly


def _confidence(z: float) -> float:
    return NormalDist().cdf(z)


def for_study(study: optuna.Study, scenario: Scenario) -> Pruner:
    """The pruner of the study's next trial. Every feasible trial, not only the front: a trial is stopped
    only when enough of them beat it for confirmation's candidates (the front and its runners-up) to be
    complete without it."""
    objectives = [o.metric for o in scenario.objectives]
    directions = [o.direction for o in scenario.objectives]
    feasible = [FrontPoint(t.number, dict(zip(objectives, t.values, strict=True)))
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get("feasible") and t.user_attrs.get("kind") not in TRUST_KINDS]
    return Pruner(scenario.slos, list(zip(objectives, directions, strict=True)), feasible, keep=DEFAULT_TOP)


def from_replay(replay: ReplayResult, now: float) -> Partial:
    """The live replay's requests so far (wall seconds, perf_counter) in engine seconds."""
    scale = replay.time_scale

    def eng(v: float | None) -> float | None:
        return None if v is None else v * scale

    done = [Done((r.finished_at - replay.start) * scale, r.ok, r.output_tokens, eng(r.ttft_s), eng(r.tpot_s),
                 eng(r.e2e_s)) for r in replay.results if r.error != CANCELLED]
    return Partial((now - replay.start) * scale, len(replay.results) + replay.not_sent, done)


async def watch(replayer: Replayer, pruner: Pruner) -> str:
    """Returns a reason once the replay so far is hopeless (runs until cancelled otherwise)."""
    while True:
        await asyncio.sleep(CHECK_PERIOD_S)
        reason = pruner.check(from_replay(replayer.result(), time.perf_counter()))
        if reason is not None:
            return reason
