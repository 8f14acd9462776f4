"""The confirmed choice: a trial re-measured by `confirm` stands on its runs' bounds (lower 95 % bound of
throughputs, upper of latencies, worst memory peak), and confirmed trials that stand are ranked by the
policy applied to those bounds."""

from __future__ import annotations

from dataclasses import replace

from autotuner.analysis.candidates import Analysis, choose, failing_slos
from autotuner.analysis.evidence import Confirmation, SoakVerdict, last_soak
from autotuner.analysis.pareto import pareto_front
from autotuner.analysis.slo import Slo
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord
from autotuner.trials.scoring import MAX_FAILED_SHARE


def confirmed_bounds(trial: TrialRecord, confirmation: Confirmation) -> TrialRecord:
    """The trial as its confirmation runs bound it: lower 95 % bound of throughputs, upper of
    latencies, the worst memory peak of all its runs."""
    metrics = {**trial.metrics, **confirmation.conservative()}
    metrics["completed"], metrics["failed"] = confirmation.completed_requests, confirmation.failed_requests
    memory = {**trial.memory, "peak_fraction": confirmation.worst_peak_fraction}
    return replace(trial, result={**trial.result, "metrics": metrics, "memory": memory})


def peak_threshold(scenario: Scenario) -> float:
    """The memory peak fraction a confirmed configuration's peak bound must stay under."""
    return scenario.oom_threshold.fraction or 0.97


def confirmation_problem(trial: TrialRecord, confirmation: Confirmation, scenario: Scenario,
                         slos: list[Slo]) -> str | None:
    """Why the confirmed trial is out (None when it stands)."""
    if confirmation.bad_runs:
        return "a confirmation run failed: " + confirmation.bad_runs[0]
    if confirmation.offload_failed:
        return "offload not verified: " + str((confirmation.offload or {}).get("reason"))
    threshold = peak_threshold(scenario)
    if confirmation.peak_bound is not None and confirmation.peak_bound >= threshold:
        return (f"memory peak up to {confirmation.peak_bound:.1%} (worst seen {confirmation.worst_peak_fraction:.1%}, "
                f"or what the next engine start may reach) ≥ threshold {threshold:.0%}")
    total = confirmation.completed_requests + confirmation.failed_requests
    if total and confirmation.failed_requests / total > MAX_FAILED_SHARE:
        return f"{confirmation.failed_requests} requests failed over its confirmation runs"
    missed = failing_slos(confirmed_bounds(trial, confirmation), slos)
    if missed:
        return "at its 95 % bound misses " + "; ".join(s.describe() for s in missed)
    return None


def confirmed_ranking(policy: str, analysis: Analysis, confirmed: dict[int, Confirmation],
                      soaked: dict[int, list[SoakVerdict]]) -> list[TrialRecord]:
    """Confirmed trials that stand (runs ok, bounds within the SLOs, worst peak under the threshold,
    offload real, last soak not failed), best first by the policy applied to their bounds."""
    pool = []
    for t in analysis.feasible:
        c = confirmed.get(t.trial_number)
        if c is None or confirmation_problem(t, c, analysis.study.scenario, analysis.slos) is not None:
            continue
        soak = last_soak(soaked, t.trial_number)
        if soak is not None and not soak.passed:
            continue
        pool.append(confirmed_bounds(t, c))
    ranked: list[TrialRecord] = []
    while pool:
        part = Analysis(analysis.study, analysis.slos, pool, pool, pareto_front(pool, analysis.study.objectives))
        pick = choose(policy, part)
        assert pick is not None
        ranked.append(pick)
        pool = [t for t in pool if t is not pick]
    return ranked
