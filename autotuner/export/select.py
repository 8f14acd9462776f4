"""Choosing the configuration to deploy: load a study from the storage, keep the trials that are
feasible (no OOM, started, served its requests) and meet every SLO, and pick one by a policy.

Feasibility is recomputed from our own tables with the tuner's own `constraints_of`, so that a user's
SLOs can be applied on top and every refusal can say which trial came closest. Optuna's tables are
not read: the `at_*` rows hold everything the tuner measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.export.slo import Slo, combine
from autotuner.scenario import Scenario
from autotuner.secrets import display_url, redact
from autotuner.store.db import Store, StudyRecord, TrialRecord, sqlalchemy_url
from autotuner.trials import memory_margin
from autotuner.trials.outcomes import TRUST_KINDS, Outcome
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import MAX_FAILED_SHARE, constraints_of, threshold_of
from autotuner.trust.summary import Confirmation, SoakVerdict, confirmations, last_soak, soaks
from autotuner.tuner.offload_axis import from_flags

Policy = Literal["max-throughput", "min-ttft", "knee"]
POLICIES: tuple[str, ...] = get_args(Policy)
THROUGHPUT = "output_tokens_per_s"
TTFT = "ttft_p95_s"
OOM_OUTCOMES = (Outcome.OOM_THRESHOLD, Outcome.OOM_CRASH)


@dataclass
class StudyData:
    record: StudyRecord
    scenario: Scenario
    trials: list[TrialRecord]
    storage: str
    note: str | None = None  # how the study was picked when no name was given

    @property
    def name(self) -> str:
        return self.record.study_name

    @property
    def objectives(self) -> list[tuple[str, str]]:
        return [(o.metric, o.direction) for o in self.scenario.objectives]

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.kind == "baseline"), None)

    @property
    def simulated(self) -> bool:
        return backend_for(self.scenario).simulated


@dataclass
class Analysis:
    """The study's trials sorted by what they are good for, under a set of SLOs."""

    study: StudyData
    slos: list[Slo]
    feasible: list[TrialRecord] = field(default_factory=list)  # no OOM, started, requests served
    candidates: list[TrialRecord] = field(default_factory=list)  # feasible and meeting every SLO
    front: list[TrialRecord] = field(default_factory=list)  # Pareto front of the candidates


@dataclass
class Selection:
    analysis: Analysis
    policy: str
    chosen: TrialRecord  # with confirmed bounds in place of its single-shot metrics when confirmed
    baseline: TrialRecord | None
    confirmation: Confirmation | None = None
    soak: SoakVerdict | None = None
    single_shot: TrialRecord | None = None  # the single-shot choice, when confirmation chose another
    missing: list[str] = field(default_factory=list)  # verification the chosen trial lacks

    @property
    def study(self) -> StudyData:
        return self.analysis.study


# --- loading -----------------------------------------------------------------------------------------

def open_store(storage: str) -> Store:
    """An existing study database, opened without creating anything in it."""
    url = sqlalchemy_url(storage)
    storage = display_url(storage)  # what messages show: never a password
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_file():
            raise UserInputError(f"storage {storage}: no such database file {path}; give the --storage that "
                                 "`autotuner tune` used")
    store = Store(url, create=False)
    try:
        has_studies = sa.inspect(store.engine).has_table("at_studies")
    except SQLAlchemyError as exc:
        raise UserInputError(redact(f"storage {storage} cannot be read: {getattr(exc, 'orig', exc)}")) from None
    if not has_studies:
        raise UserInputError(f"storage {storage} holds no autotuner study: run `autotuner tune SCENARIO "
                             f"--storage {storage}` first")
    return store


def load_study(storage: str, name: str | None) -> StudyData:
    store = open_store(storage)
    storage = display_url(storage)
    studies = store.studies()
    if not studies:
        raise UserInputError(f"storage {storage} holds no study: run `autotuner tune SCENARIO --storage {storage}` "
                             "first")
    note = None
    if name is None:
        record = studies[-1]  # ordered by creation time
        if len(studies) > 1:
            note = (f"{len(studies)} studies in {storage}; using the latest, {record.study_name} "
                    "(choose one with --study)")
    else:
        found = store.study(name)
        if found is None:
            names = ", ".join(s.study_name for s in studies)
            raise UserInputError(f"study {name!r} is not in {storage}; studies there: {names}")
        record = found
    data = read_study(store, record, storage, note)
    if not data.trials:
        raise UserInputError(f"study {record.study_name} in {storage} has no finished trial yet: run "
                             f"`autotuner tune` with this storage until at least the baseline is measured")
    return data


def read_study(store: Store, record: StudyRecord, storage: str, note: str | None = None) -> StudyData:
    """The study with its scenario rebuilt and its trials (possibly none yet)."""
    try:
        scenario = Scenario.model_validate(record.scenario, context={"stored": True})
    except ValidationError as exc:
        raise UserInputError(f"study {record.study_name}: its stored scenario no longer validates "
                             f"({exc.errors()[0]['msg']}); re-tune with the current autotuner") from None
    return StudyData(record, scenario, store.trials(record.study_name), storage, note)


# --- feasibility -------------------------------------------------------------------------------------

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
    missing = [metric for metric, _ in _objectives(scenario) if _number(trial.metrics.get(metric)) is None]
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
    if trial.reason and trial.reason not in text:
        text = f"{text}: {trial.reason}" if text else trial.reason
    return text


def analyse(study: StudyData, slos: list[Slo]) -> Analysis:
    out = Analysis(study, slos)
    search = [t for t in study.trials if t.kind not in TRUST_KINDS]  # re-measurements are evidence, not candidates
    out.feasible = [t for t in search if infeasible_reason(t, study.scenario) is None]
    out.candidates = [t for t in out.feasible if not failing_slos(t, slos)]
    out.front = pareto_front(out.candidates, study.objectives)
    return out


# --- choosing ----------------------------------------------------------------------------------------

def pareto_front(trials: list[TrialRecord], objectives: list[tuple[str, str]]) -> list[TrialRecord]:
    """Non-dominated trials (every objective at least as good, one strictly better dominates)."""
    def vector(t: TrialRecord) -> list[float]:
        return [_oriented(t, metric, direction) for metric, direction in objectives]

    vectors = {t.trial_number: vector(t) for t in trials}

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))

    return [t for t in trials
            if not any(dominates(vectors[o.trial_number], vectors[t.trial_number]) for o in trials if o is not t)]


def knee(front: list[TrialRecord], objectives: list[tuple[str, str]]) -> TrialRecord:
    """The front's point nearest the utopia point, each objective scaled to [0, 1] over the front (1 =
    best), so that neither objective's unit decides."""
    if len(front) == 1:
        return front[0]
    scaled: dict[int, list[float]] = {t.trial_number: [] for t in front}
    for metric, direction in objectives:
        values = {t.trial_number: _oriented(t, metric, direction) for t in front}
        low, high = min(values.values()), max(values.values())
        for number, value in values.items():
            # A flat objective separates nothing: every point is at its best there.
            scaled[number].append(1.0 if high == low else (value - low) / (high - low))

    def distance(t: TrialRecord) -> tuple[float, int]:
        return math.dist(scaled[t.trial_number], [1.0] * len(objectives)), t.trial_number

    return min(front, key=distance)


def choose(policy: str, analysis: Analysis) -> TrialRecord | None:
    candidates = analysis.candidates
    if not candidates:
        return None
    if policy == "max-throughput":
        return max(candidates, key=lambda t: (_value(t, THROUGHPUT, True), -_value(t, TTFT, False),
                                              -t.trial_number))
    if policy == "min-ttft":
        return min(candidates, key=lambda t: (_value(t, TTFT, False), -_value(t, THROUGHPUT, True),
                                              t.trial_number))
    return knee(analysis.front, analysis.study.objectives)


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise UserInputError(f"--policy {policy!r}: use one of {', '.join(POLICIES)}")


def select(storage: str, study: str | None, slo: list[str], policy: str) -> Selection:
    """The trial to deploy and the baseline to compare it with; UserInputError when there is none."""
    check_policy(policy)
    data = load_study(storage, study)
    slos = combine(data.scenario.slos, slo)
    analysis = analyse(data, slos)
    if not analysis.feasible:
        raise UserInputError(_no_feasible(data))
    naive = choose(policy, analysis)
    confirmed = confirmations(data.trials)
    soaked = soaks(data.trials)
    ranked = confirmed_ranking(policy, analysis, confirmed, soaked)
    chosen = ranked[0] if ranked else naive
    if chosen is None:
        raise UserInputError(_no_slo(analysis))
    selection = Selection(analysis, policy, chosen, data.baseline, confirmed.get(chosen.trial_number),
                          last_soak(soaked, chosen.trial_number))
    if naive is not None and naive.trial_number != chosen.trial_number:
        selection.single_shot = naive
    selection.missing = missing_verification(selection)
    return selection


# --- confirmed choice --------------------------------------------------------------------------------

def confirmed_bounds(trial: TrialRecord, confirmation: Confirmation) -> TrialRecord:
    """The trial as its confirmation runs bound it: lower 95 % bound of throughputs, upper of
    latencies, the worst memory peak of all its runs."""
    metrics = {**trial.metrics, **confirmation.conservative()}
    metrics["completed"], metrics["failed"] = confirmation.completed_requests, confirmation.failed_requests
    memory = {**trial.memory, "peak_fraction": confirmation.worst_peak_fraction}
    return replace(trial, result={**trial.result, "metrics": metrics, "memory": memory})


def confirmation_problem(trial: TrialRecord, confirmation: Confirmation, scenario: Scenario,
                         slos: list[Slo]) -> str | None:
    """Why the confirmed trial is out (None when it stands)."""
    if confirmation.bad_runs:
        return "a confirmation run failed: " + confirmation.bad_runs[0]
    if confirmation.offload_failed:
        return "offload not verified: " + str((confirmation.offload or {}).get("reason"))
    threshold = scenario.oom_threshold.fraction or 0.97
    if confirmation.peak_bound is not None and confirmation.peak_bound >= threshold:
        return (f"memory peak up to {confirmation.peak_bound:.1%} (worst seen {confirmation.worst_peak_fraction:.1%}, "
                f"or its upper 95 % bound) ≥ threshold {threshold:.0%}")
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


def missing_verification(selection: Selection) -> list[str]:
    """What the chosen trial lacks before it can be called safe, each with the command that adds it."""
    name = selection.study.name
    chosen = selection.chosen
    out = []
    c = selection.confirmation
    if c is None:
        out.append(f"confirmation (re-measured runs): run `autotuner confirm --study {name}`")
    else:
        problem = confirmation_problem(chosen, c, selection.study.scenario, selection.analysis.slos)
        if problem:
            out.append(f"a confirmation that holds ({problem}): tune further or run "
                       f"`autotuner confirm --study {name}`")
    if selection.soak is None:
        out.append(f"a soak under the worst workload: run `autotuner soak --study {name}`")
    elif not selection.soak.passed:
        out.append(f"a passed soak (trial {selection.soak.trial}: {selection.soak.reason}): "
                   f"run `autotuner soak --study {name}` for the next candidate")
    mode, offload = from_flags(chosen.flags, None)
    if mode != "none" and (c is None or c.offload is None or c.offload.get("verified") is not True):
        asked = f"--cpu-offload-gb {offload:g}" if mode == "uva" else "the prefetch offload"
        out.append(f"evidence that {asked} really offloaded: run `autotuner confirm --study {name}`")
    return out


# --- messages ----------------------------------------------------------------------------------------

def outcome_counts(trials: list[TrialRecord]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _no_feasible(study: StudyData) -> str:
    return (f"study {study.name} has no feasible trial ({len(study.trials)} trials: {outcome_counts(study.trials)}); "
            "nothing is safe to export. Tune longer (--trials), widen the search space toward less memory "
            "(lower max-num-batched-tokens or gpu-memory-utilization, some cpu-offload-gb), or see "
            f"`autotuner report --study {study.name}`")


def _no_slo(analysis: Analysis) -> str:
    feasible = analysis.feasible
    parts = []
    for slo in analysis.slos:
        values = [(t.metrics.get(slo.metric), t.trial_number) for t in feasible]
        measured = [(float(v), n) for v, n in values if _number(v) is not None]
        meeting = sum(1 for v, _ in measured if slo.passes(v))
        origin = " (scenario slos)" if slo.source == "scenario" else ""
        text = f"{slo.describe()}{origin}: {meeting} of {len(feasible)} feasible trials meet it"
        if measured:
            pick = max if slo.higher_is_better else min
            best, number = pick(measured)
            text += f", best seen {slo.show_value(best)} (trial {number}); e.g. --slo '{slo.suggest(best)}'"
        parts.append(text)
    return (f"no feasible trial of study {analysis.study.name} meets every SLO — " + "; ".join(parts)
            + ". Relax the SLO (a --slo can only tighten the scenario's slos) or tune longer.")


def _objectives(scenario: Scenario) -> list[tuple[str, str]]:
    return [(o.metric, o.direction) for o in scenario.objectives]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _value(trial: TrialRecord, metric: str, higher_is_better: bool) -> float:
    """The metric, with a missing one ranked last."""
    value = _number(trial.metrics.get(metric))
    if value is None:
        return -math.inf if higher_is_better else math.inf
    return value


def _oriented(trial: TrialRecord, metric: str, direction: str) -> float:
    """Larger is better, whatever the objective's direction."""
    value = _value(trial, metric, direction == "maximize")
    return value if direction == "maximize" else -value
