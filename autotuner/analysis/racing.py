"""Racing the confirmation: stop re-measuring what is already beaten.

Confirmation measures every candidate R times and every reference R − 1 (its search run the R-th; so
too every candidate when confirmation took all the search found feasible: trust/confirm.py),
interleaved; most of those engine starts go to configurations that the first round already shows to be
clearly worse. As F-race and irace do for algorithm configuration, after each round a configuration that
another one beats, significantly and on every objective, is measured no more; the others go on. What the
certificate stands on is unchanged: the confirmed best always gets all R runs, and a counted configuration
keeps at least two lifetimes (so a comparison with a reference stands on an interval, never on one run:
its search run is one of them, as it is in its interval, analysis/evidence.py).

The test, in log space (run-to-run spread is a share of the figure, ~3 %): the leader's mean over its
confirmation runs only (its search run was picked for being lucky; a counted one was not, and counts), the
other's over its search run and its confirmation runs (that search run favours it: the test can only be
slower to drop it); their difference against Student's t at 95 % of the spread pooled over every
configuration raced, which needs at least two degrees of freedom. A lifetime that replayed the workload
counts once, at the mean of its replays (analysis/lifetimes.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from autotuner.analysis.lifetimes import lifetime_means
from autotuner.stats import pooled_sd, t975
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome

# Lifetimes a configuration has before it may be dropped: a candidate one confirmation run; one whose
# search run counts (a reference, or a candidate nothing picked for luck) two, its search run one of them.
MIN_RUNS, MIN_COUNTED_RUNS = 1, 2


def _log(value: object) -> float | None:
    return math.log(float(value)) if isinstance(value, int | float) and value > 0 else None


def _samples(trials: Iterable[TrialRecord], raced: set[int], counted: set[int],
             metric: str) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per original: its lifetimes' values (each the mean of its replays; a counted search run among
    them), and a picked candidate's search run's value (logs; ok runs only)."""
    confirm_rows: dict[int, list[TrialRecord]] = {n: [] for n in raced}
    first: dict[int, list[float]] = {n: [] for n in raced}
    for t in trials:
        confirms = t.result.get("confirms")
        if t.kind == "confirm" and confirms in raced:
            confirm_rows[int(confirms)].append(t)
        elif t.trial_number in raced and t.outcome == Outcome.OK and t.state == "COMPLETE":
            v = _log(t.metrics.get(metric))
            if v is not None:
                first[t.trial_number].append(v)
    runs = {n: lifetime_means(rows, metric, _log) for n, rows in confirm_rows.items()}
    for n in raced & counted:
        runs[n], first[n] = first[n] + runs[n], []
    return runs, first


def beaten(trials: Sequence[TrialRecord], raced: list[int], counted: set[int],
           objectives: Sequence[tuple[str, str]]) -> dict[int, str]:
    """The raced originals to measure no more, each with why: a confirmation run that failed, or another
    raced configuration significantly better on every objective. `counted`: those whose search run is one
    of their lifetimes."""
    active = set(raced)
    out: dict[int, str] = {}
    for t in trials:
        confirms = t.result.get("confirms")
        if t.kind == "confirm" and confirms in active and (t.outcome != Outcome.OK or t.state != "COMPLETE"):
            out[int(confirms)] = f"its confirmation run {t.trial_number} failed ({t.outcome})"
    alive = [n for n in raced if n not in out]
    per_metric = []
    for metric, direction in objectives:
        runs, first = _samples(trials, set(alive), counted, metric)
        spread = pooled_sd([first[n] + runs[n] for n in alive])
        if spread is None or spread[1] < 2:
            return out
        per_metric.append((metric, 1.0 if direction == "maximize" else -1.0, runs, first, *spread))
    for loser in alive:
        needed = MIN_COUNTED_RUNS if loser in counted else MIN_RUNS
        if any(len(runs[loser]) < needed for _, _, runs, _, _, _ in per_metric):
            continue
        for leader in alive:
            if leader == loser or any(not runs[leader] for _, _, runs, _, _, _ in per_metric):
                continue
            margins = []
            for metric, sign, runs, first, sd, df in per_metric:
                mine, theirs = runs[leader], first[loser] + runs[loser]
                diff = sign * (sum(mine) / len(mine) - sum(theirs) / len(theirs))
                bound = t975(df) * sd * math.sqrt(1 / len(mine) + 1 / len(theirs))
                if diff <= bound:
                    break
                margins.append(f"{metric} {math.expm1(diff):+.1%} (bound {math.expm1(bound):.1%})")
            else:
                out[loser] = f"trial {leader} is better on every objective beyond the noise: {', '.join(margins)}"
                break
    return out
