"""What the trust trials say, read back from the study's `at_trials` rows (pure functions): per
original trial, its confirmation runs summarised (mean and 95 % CI per metric over its engine
lifetimes, each the mean of its replays; worst memory peak; failed runs) and its soak verdicts. `export`
selects and certifies from these.

The intervals stand on the run-to-run spread pooled over every configuration confirmed in the study
(relative, as the spread is a share of the figure; racing's test stands on the same): racing leaves a
beaten reference two lifetimes, and two runs alone would give an interval about five times as wide as
the pooled one for the same spread (t = 12.7 at one degree of freedom, against ~2.3 at eight).

A search run that nothing picked for being good is one of its configuration's lifetimes: a reference's
(vLLM's defaults, the user's current config: it was run because it is the reference), and a candidate's
when confirmation took every SLO-feasible configuration the search measured. It carries none of the
winner's curse that keeps a picked candidate's search run out of its mean. Its confirmation runs say so
(`search_run` in their result; `reference` in studies confirmed before 2026-12-07's second change);
confirmation then spends one engine start fewer on it (trust/confirm.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotuner.analysis.lifetimes import lifetime_means, lifetime_of
from autotuner.stats import Interval, interval, next_high, next_run, pooled_log_sd, pooled_sd
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome

SUMMARISED = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p95_s",
              "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s")


def higher_is_better(metric: str) -> bool:
    return metric.endswith("per_s")


@dataclass
class Confirmation:
    original: int
    runs: list[int] = field(default_factory=list)
    lifetimes: int = 0  # engine starts among the runs (a lifetime may replay the workload several times)
    bad_runs: list[str] = field(default_factory=list)  # "trial N: outcome — reason" of runs not ok
    intervals: dict[str, Interval] = field(default_factory=dict)
    # Where one more engine start of it falls (95 %): what a single later run (verify) is held against.
    next_run: dict[str, Interval] = field(default_factory=dict)
    worst_peak_fraction: float | None = None  # over the original and every confirmation run
    # The larger of the worst peak and what the next engine start's peak may reach (upper 97.5 % prediction
    # bound over the lifetimes' peaks): a bound on their mean would pass a config that runs out of memory
    # in every other start as long as the starts seen were lucky.
    peak_bound: float | None = None
    # The same on the box's pooled peak spread alone: what the bound tends to once the configuration's own
    # starts are enough to tell its spread (at two starts, t = 12.7 makes any peak near the wall refused).
    peak_bound_pooled: float | None = None
    failed_requests: int = 0
    completed_requests: int = 0
    offload: dict[str, Any] | None = None  # the offload check (offload.py), when offload was asked
    search_run: bool = False  # its search run is one of the lifetimes the intervals stand on (not picked for luck)

    @property
    def offload_failed(self) -> bool:
        return self.offload is not None and self.offload.get("verified") is False

    def conservative(self) -> dict[str, float]:
        """The bound a deployer can count on: lower for throughputs, upper for latencies."""
        out: dict[str, float] = {}
        for metric, iv in self.intervals.items():
            out[metric] = iv.low if higher_is_better(metric) else iv.high
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"original": self.original, "runs": self.runs, "lifetimes": self.lifetimes, "bad_runs": self.bad_runs,
                "intervals": {k: vars(v) for k, v in self.intervals.items()},
                "next_run": {k: vars(v) for k, v in self.next_run.items()},
                "worst_peak_fraction": self.worst_peak_fraction, "peak_bound": self.peak_bound,
                "failed_requests": self.failed_requests,
                "completed_requests": self.completed_requests,
                "offload": self.offload, "search_run": self.search_run}


@dataclass
class SoakVerdict:
    trial: int
    original: int
    passed: bool
    reason: str | None
    duration_s: float | None
    peak_fraction: float | None
    ttft_p99_s: float | None
    itl_p99_s: float | None
    workload: str
    headroom_gib: list[float]
    finished_at: float
    after_confirm: bool = False  # on the engine of its last confirmation run (no start of its own)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def confirmations(trials: list[TrialRecord]) -> dict[int, Confirmation]:
    by_number = {t.trial_number: t for t in trials}
    runs: dict[int, list[TrialRecord]] = {}
    for t in trials:
        if t.kind == "confirm" and isinstance(t.result.get("confirms"), int):
            runs.setdefault(int(t.result["confirms"]), []).append(t)
    ok_rows = {original: [r for r in rows if _ok(r)] for original, rows in runs.items()}
    lifetimes = {original: ([by_number[original], *ok] if _counts_search_run(runs[original], by_number.get(original))
                            else ok) for original, ok in ok_rows.items()}
    means = {metric: {original: lifetime_means(rows, metric) for original, rows in lifetimes.items()}
             for metric in SUMMARISED}
    spread = {metric: pooled_log_sd(list(by_original.values())) for metric, by_original in means.items()}
    peaks = {original: _lifetime_peaks(rows, by_number.get(original)) for original, rows in runs.items()}
    # The allocator's run-to-run jitter is the box's, not one configuration's: pooled, as the spread is.
    peak_spread = pooled_sd(list(peaks.values()))
    out: dict[int, Confirmation] = {}
    for original, rows in runs.items():
        c = Confirmation(original, [r.trial_number for r in rows])
        c.search_run = lifetimes[original] is not ok_rows[original]
        ok = ok_rows[original]
        c.bad_runs = [f"trial {r.trial_number}: {r.outcome}" + (f" — {r.reason}" if r.reason else "")
                      for r in rows if r not in ok]
        for metric in SUMMARISED:
            iv = interval(means[metric][original], spread[metric])
            if iv is not None:
                c.intervals[metric] = iv
            ahead = next_run(means[metric][original], spread[metric])
            if ahead is not None:
                c.next_run[metric] = ahead
        c.lifetimes = len({lifetime_of(r) for r in rows})
        seen = peaks[original]
        c.worst_peak_fraction = max(seen) if seen else None
        # A memory bound errs high: on its own spread at its own t, and on the box's.
        pooled = [b for b in (next_high(seen, peak_spread),) if b is not None]
        reach = [b for b in (next_high(seen),) if b is not None] + pooled
        c.peak_bound = max([*seen, *reach]) if seen else None
        c.peak_bound_pooled = max([*seen, *pooled]) if seen else None
        c.failed_requests = sum(int(r.metrics.get("failed") or 0) for r in ok)
        c.completed_requests = sum(int(r.metrics.get("completed") or 0) for r in ok)
        checks = [r.result.get("offload") for r in rows if isinstance(r.result.get("offload"), dict)]
        if checks:  # one run that did not offload is enough to distrust the flag
            c.offload = next((x for x in checks if x.get("verified") is False), checks[-1])
        out[original] = c
    return out


def _lifetime_peaks(rows: list[TrialRecord], original: TrialRecord | None) -> list[float]:
    """One peak fraction per engine lifetime of the configuration, its search run's among them: a
    lifetime's replays all carry the lifetime's peak, and copies are no evidence."""
    by_lifetime: dict[tuple[int, int | str], float] = {}
    for r in rows:
        peak = r.memory.get("peak_fraction")
        if isinstance(peak, int | float):
            key = lifetime_of(r)
            by_lifetime[key] = max(float(peak), by_lifetime.get(key, 0.0))
    found: list[object] = list(by_lifetime.values())
    if original is not None:
        found.append(original.memory.get("peak_fraction"))
    return [float(p) for p in found if isinstance(p, int | float)]


def _ok(t: TrialRecord) -> bool:
    return t.outcome == Outcome.OK and t.state == "COMPLETE"


def _counts_search_run(rows: list[TrialRecord], original: TrialRecord | None) -> bool:
    # `reference`: the mark of studies confirmed before candidates' search runs could count too
    marked = any(r.result.get("search_run") is True or r.result.get("reference") is True for r in rows)
    return original is not None and _ok(original) and marked


def soaks(trials: list[TrialRecord]) -> dict[int, list[SoakVerdict]]:
    out: dict[int, list[SoakVerdict]] = {}
    for t in trials:
        verdict = t.result.get("soak")
        if t.kind != "soak" or not isinstance(verdict, dict):
            continue
        out.setdefault(int(verdict["original"]), []).append(SoakVerdict(**{**verdict, "trial": t.trial_number}))
    return out


def last_soak(verdicts: dict[int, list[SoakVerdict]], original: int) -> SoakVerdict | None:
    found = verdicts.get(original)
    return max(found, key=lambda v: v.trial) if found else None
