"""Backing off the memory wall: which confirmed configuration, refused only on its memory peak, is worth
re-trying with less memory, and by how much.

A search's best configurations sit at the memory wall, and confirmation refuses one whose peak may reach
the threshold at the next engine start (the peak bound, analysis/evidence.py): rightly, but then the user
loses the fastest configuration for a fraction of a point of memory, and a configuration the search
happened to measure further from the wall — often a different token budget, slower — is certified instead.
Utilization sizes the KV cache, and the measured peak follows it about point for point with the token
budget and offload unchanged (benchmarks/README.md, winner_regret), so the same flags with utilization
lowered by the bound's excess keep nearly all of the speed and stand under the wall.

Asked only of the configuration that would be the confirmed best but for its peak: one back-off per
study, measured and confirmed like any candidate (trust/backoff.py), so its cost is bounded and its
certificate stands on the same evidence as any other.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from autotuner.analysis.candidates import analyse
from autotuner.analysis.confirmed import confirmation_problem, confirmed_ranking, peak_threshold
from autotuner.analysis.evidence import Confirmation, confirmations, soaks
from autotuner.analysis.slo import Slo, combine
from autotuner.analysis.study_data import StudyData
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord


@dataclass(frozen=True)
class Backoff:
    trial: TrialRecord  # refused on its memory peak bound alone; first in the ranking without that
    peak_bound: float  # what its next engine start's peak may reach
    threshold: float  # the fraction the bound crossed

    @property
    def excess(self) -> float:
        return self.peak_bound - self.threshold


def peak_only(trial: TrialRecord, confirmation: Confirmation, scenario: Scenario, slos: list[Slo]) -> bool:
    """Whether the memory peak bound is all that refuses the confirmed trial."""
    if confirmation.peak_bound is None or confirmation.peak_bound < peak_threshold(scenario):
        return False
    return confirmation_problem(trial, replace(confirmation, peak_bound=None), scenario, slos) is None


def first_but_for_peaks(data: StudyData, policy: str, forgive: Collection[int]) -> int | None:
    """The trial the confirmed ranking puts first when the memory peak bounds of `forgive` are not held
    against them."""
    return _first(data, policy, confirmations(data.trials), forgive)


def _first(data: StudyData, policy: str, found: dict[int, Confirmation], forgive: Collection[int]) -> int | None:
    forgiven = {n: replace(c, peak_bound=None) if n in forgive else c for n, c in found.items()}
    ranked = confirmed_ranking(policy, analyse(data, combine(data.scenario.slos, [])), forgiven, soaks(data.trials))
    return ranked[0].trial_number if ranked else None


def worth_backing_off(data: StudyData, policy: str) -> Backoff | None:
    """The configuration to back off: the one the confirmed ranking would put first were its memory peak
    bound not held against it, when that bound is all that refuses it; None when the confirmed best
    already stands first that way, or nothing confirmed was refused on its peak alone."""
    found = confirmations(data.trials)
    by_number = {t.trial_number: t for t in data.trials}
    slos = combine(data.scenario.slos, [])
    refused = {n for n, c in found.items() if n in by_number and peak_only(by_number[n], c, data.scenario, slos)}
    first = _first(data, policy, found, refused) if refused else None
    if first not in refused:
        return None
    bound = found[first].peak_bound
    assert bound is not None
    return Backoff(by_number[first], bound, peak_threshold(data.scenario))
