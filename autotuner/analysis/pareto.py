"""The Pareto front of the candidates and its knee, over the scenario's objectives; a missing or
non-finite metric ranks last."""

from __future__ import annotations

import math

from autotuner.store.db import TrialRecord


def pareto_front(trials: list[TrialRecord], objectives: list[tuple[str, str]]) -> list[TrialRecord]:
    """Non-dominated trials (every objective at least as good, one strictly better dominates)."""
    def vector(t: TrialRecord) -> list[float]:
        return [oriented(t, metric, direction) for metric, direction in objectives]

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
        values = {t.trial_number: oriented(t, metric, direction) for t in front}
        low, high = min(values.values()), max(values.values())
        for number, value in values.items():
            # A flat objective separates nothing: every point is at its best there.
            scaled[number].append(1.0 if high == low else (value - low) / (high - low))

    def distance(t: TrialRecord) -> tuple[float, int]:
        return math.dist(scaled[t.trial_number], [1.0] * len(objectives)), t.trial_number

    return min(front, key=distance)


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def metric_value(trial: TrialRecord, metric: str, higher_is_better: bool) -> float:
    """The metric, with a missing one ranked last."""
    value = number(trial.metrics.get(metric))
    if value is None:
        return -math.inf if higher_is_better else math.inf
    return value


def oriented(trial: TrialRecord, metric: str, direction: str) -> float:
    """Larger is better, whatever the objective's direction."""
    value = metric_value(trial, metric, direction == "maximize")
    return value if direction == "maximize" else -value
