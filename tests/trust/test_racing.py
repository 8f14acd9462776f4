"""Racing the confirmation (analysis/racing.py): what another configuration beats beyond the noise, on every
objective, is measured no more; a candidate after one confirmation run, a reference after two lifetimes, its
search run one of them (its comparisons stand on an interval); a configuration with a failed run at once;
nothing without an estimate of the noise. Records built by hand: the test is of the rule, on figures whose
answer is known."""

from __future__ import annotations

from typing import Any

from autotuner.analysis.racing import beaten
from autotuner.store.db import TrialRecord

TPS, TTFT = "output_tokens_per_s", "ttft_p95_s"
BOTH = [(TPS, "maximize"), (TTFT, "minimize")]


def rec(number: int, tps: float, ttft: float = 1.0, *, confirms: int | None = None, outcome: str = "ok") -> TrialRecord:
    result: dict[str, Any] = {"metrics": {TPS: tps, TTFT: ttft}}
    if confirms is not None:
        result["confirms"] = confirms
    return TrialRecord(number, "confirm" if confirms is not None else "search", outcome, None, "COMPLETE", {}, result)


# Search runs: 0 is vLLM's defaults (the reference), 1 the best, 2 far behind, 3 within the noise of 1.
SEARCH = [rec(0, 80.0, 1.4), rec(1, 103.0, 0.9), rec(2, 82.0, 1.2), rec(3, 101.0, 0.92)]


def round_of(n: int, base: int, spread: float) -> list[TrialRecord]:
    """One confirmation round: each configuration once, ~`spread` off its search figure."""
    return [rec(base, 80.0 * (1 + spread), 1.4, confirms=0), rec(base + 1, 100.0 * (1 - spread), 0.9, confirms=1),
            rec(base + 2, 82.0 * (1 - spread), 1.2, confirms=2), rec(base + 3, 101.0 * (1 + spread), 0.91, confirms=3)]


def test_after_one_round_a_candidate_and_a_reference_far_behind_are_dropped() -> None:
    trials = SEARCH + round_of(1, 10, 0.01)
    out = beaten(trials, [1, 2, 3, 0], counted={0}, objectives=BOTH)
    # The reference's search run and its one confirmation run are two lifetimes: an interval.
    assert set(out) == {0, 2}, out
    assert out[2].startswith("trial 1 is better on every objective") or out[2].startswith("trial 3 is better")


def test_a_reference_with_its_search_run_alone_is_kept() -> None:
    # Only the candidates have been re-measured: the reference stands on one run, and is kept however far
    # behind; a candidate that far behind goes after its one confirmation run.
    trials = SEARCH + [t for t in round_of(1, 10, 0.01) if t.result["confirms"] != 0]
    out = beaten(trials, [1, 2, 3, 0], counted={0}, objectives=BOTH)
    assert set(out) == {2}, out


def test_better_on_one_objective_only_stays_in_the_race() -> None:
    # 2 is slower but answers first: neither beats the other on every objective.
    trials = [rec(1, 103.0, 1.2), rec(2, 82.0, 0.5), rec(3, 101.0, 1.21),
              rec(10, 100.0, 1.2, confirms=1), rec(11, 83.0, 0.52, confirms=2), rec(12, 102.0, 1.19, confirms=3)]
    assert beaten(trials, [1, 2, 3], set(), BOTH) == {}
    # Throughput alone: 2 is behind beyond the noise.
    assert set(beaten(trials, [1, 2, 3], set(), [(TPS, "maximize")])) == {2}


def test_within_the_noise_nobody_is_dropped() -> None:
    trials = [rec(1, 100.0), rec(2, 97.0), rec(3, 104.0),
              rec(10, 96.0, confirms=1), rec(11, 101.0, confirms=2), rec(12, 99.0, confirms=3)]
    assert beaten(trials, [1, 2, 3], set(), [(TPS, "maximize")]) == {}


def test_a_failed_confirmation_run_drops_it_at_once() -> None:
    trials = [*SEARCH[:2], rec(10, 0.0, confirms=1, outcome="oom-crash"), rec(11, 100.0, confirms=0)]
    out = beaten(trials, [1, 0], {0}, [(TPS, "maximize")])
    assert out == {1: "its confirmation run 10 failed (oom-crash)"}


def test_without_an_estimate_of_the_noise_nothing_is_dropped() -> None:
    # One configuration raced: no degrees of freedom for the spread.
    assert beaten([rec(1, 100.0), rec(10, 99.0, confirms=1)], [1], set(), [(TPS, "maximize")]) == {}
    # Nothing measured twice yet: no spread at all.
    assert beaten([rec(1, 100.0), rec(2, 50.0)], [1, 2], set(), [(TPS, "maximize")]) == {}
