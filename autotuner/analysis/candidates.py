"""Which trials can be deployed under a set of SLOs: feasibility recomputed from our own tables with the
tuner's own `constraints_of` (so a user's SLOs apply on top and every refusal can say which trial came
closest), the candidates that meet every SLO, their Pareto front, and the one a policy picks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from autotuner.analysis.pareto import knee, metric_value, number, pareto_front
from autotuner.analysis.slo import Slo
from autotuner.analysis.study_data import StudyData
from autotuner.analysis.wording import bare_reason
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord
from autotuner.trials import memory_margin
from autotuner.trials.outcomes import TRUST_KINDS, Outcome
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import constraints_of, threshold_of

Policy = Literal["max-throughput", "min-ttft", "knee"]
POLICIES: tuple[str, ...] = get_args(Policy)
THROUGHPUT = "output_tokens_per_s"
TTFT = "ttft_p95_s"


@dataclass
class Analysis:
    """The study's trials sorted by what they are good for, under a set of SLOs."""

    study: StudyData
    slos: list[Slo]
    feasible: list[TrialRecord] = field(default_factory=list)  # no OOM, started, requests served
    candidates: list[TrialRecord] = field(default_factory=list)  # feasible and meeting every SLO
    front: list[TrialRecord] = field(default_factory=list)  # Pareto front of the candidates


def infeasible_reason(trial: TrialRecord, scenario: Scenario) -> str | None:
    """Why this trial cannot be deployed (None when it can), SLOs aside."""
    if trial.state != "COMPLETE":
        return f"{trial.outcome} (not completed)"
    if trial.outcome != Outcome.OK:
        return trial.outcome
    result = TrialResult(trial.outcome, trial.reason, dict(trial.flags), [], metrics=trial.metrics,
                         memory=trial.memory)
    constraints = constraints_of(result, scenario)
    if constraints["memory"] > 0:
        threshold = threshold_of(scenario)
        peak = f"memory peak {trial.memory.get('peak_fraction', 0):.1%}"
        if threshold.fraction is not None:
            return f"{peak} ≥ threshold {threshold.fraction:.0%}"
        return f"{peak} leaves under {threshold.min_free_mib:g} MiB free ({memory_margin.describe(threshold)})"
    if constraints["requests"] > 0:
        m = trial.metrics
        return f"{m.get('failed') or 0} of {(m.get('completed') or 0) + (m.get('failed') or 0)} requests failed"
    missing = [o.metric for o in scenario.objectives if number(trial.metrics.get(o.metric)) is None]
    if missing:
        return f"no {', '.join(missing)} measured"
    return None


def failing_slos(trial: TrialRecord, slos: list[Slo]) -> list[Slo]:
    return [s for s in slos if not s.passes(trial.metrics.get(s.metric))]


def verdict(trial: TrialRecord, analysis: Analysis) -> str:
    """Why a trial is not a candidate (empty when it is), with the engine's own reason when it gave one."""
    why = infeasible_reason(trial, analysis.study.scenario)
    missed = failing_slos(trial, analysis.slos) if why is None else []
    text = why or ("misses " + "; ".join(s.describe() for s in missed) if missed else "")
    if trial.outcome != Outcome.OK and text == trial.outcome:
        text = ""  # the outcome column says it: the reason alone, once (not "pruned: pruned: …")
    reason = bare_reason(trial.reason or "")
    if reason and reason not in text:
        text = f"{text}: {reason}" if text else reason
    return text


def analyse(study: StudyData, slos: list[Slo]) -> Analysis:
    out = Analysis(study, slos)
    search = [t for t in study.trials if t.kind not in TRUST_KINDS]  # re-measurements are evidence, not candidates
    out.feasible = [t for t in search if infeasible_reason(t, study.scenario) is None]
    out.candidates = [t for t in out.feasible if not failing_slos(t, slos)]
    out.front = pareto_front(out.candidates, study.objectives)
    return out


def choose(policy: str, analysis: Analysis) -> TrialRecord | None:
    candidates = analysis.candidates
    if not candidates:
        return None
    if policy == "max-throughput":
        return max(candidates, key=lambda t: (metric_value(t, THROUGHPUT, True), -metric_value(t, TTFT, False),
                                              -t.trial_number))
    if policy == "min-ttft":
        return min(candidates, key=lambda t: (metric_value(t, TTFT, False), -metric_value(t, THROUGHPUT, True),
                                              t.trial_number))
    return knee(analysis.front, analysis.study.objectives)


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise UserInputError(f"--policy {policy!r}: use one of {', '.join(POLICIES)}")
