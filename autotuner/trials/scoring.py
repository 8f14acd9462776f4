"""The rules that score a trial: its constraints (what Optuna is told, what export re-checks), when
it is feasible, which trials count against the search budget, and how many candidates confirmation
re-measures.

One copy for everyone: the study loop tells these to the sampler, trust records its re-measurements
with them, and selection recomputes feasibility from the stored rows with them, so a user's change
of SLOs or of the threshold re-scores old trials the same way the study would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autotuner.monitor import Threshold
from autotuner.scenario import Scenario
from autotuner.trials import memory_margin
from autotuner.trials.outcomes import AFTER_SEARCH, NOT_SERVED, Outcome
from autotuner.trials.result import TrialResult

CONSTRAINT_KEYS = ("memory", "startup", "requests", "slo")
# Beyond this share of failed requests a configuration is not deployable.
MAX_FAILED_SHARE = 0.01
# Stand-in for "as slow as it gets" when no trial was feasible yet (seconds).
WORST_LATENCY_S = 600.0
# How many candidates confirmation re-measures, and how often each (`tune --confirm KxR`); the study's early
# stopping lets that many finish (tuner/pruning.py).
DEFAULT_TOP, DEFAULT_REPEATS = 3, 3
# Replays of the workload on each confirmation lifetime's engine (while the spread lives there).
DEFAULT_REPLAYS = 2


def threshold_of(scenario: Scenario) -> Threshold:
    """The scenario's OOM wall as the sampler and the constraints apply it."""
    t = scenario.oom_threshold
    return Threshold(fraction=t.fraction, min_free_mib=t.min_free_mib)


def constraints_of(result: TrialResult, scenario: Scenario) -> dict[str, float]:
    """The same keys on every trial (GPSampler insists), continuous where measurable."""
    threshold = threshold_of(scenario)  # the sampler's threshold: fraction or min_free_mib
    out = dict.fromkeys(CONSTRAINT_KEYS, -1.0)
    out["memory"] = memory_margin.excess(result.memory, threshold)
    if result.outcome == Outcome.OOM_THRESHOLD:
        out["memory"] = max(out["memory"], 1e-3)
    elif result.outcome == Outcome.OOM_PREDICTED:
        out["memory"] = 1e-3
    elif result.outcome == Outcome.OOM_CRASH:
        out["memory"] = max(out["memory"], memory_margin.crash_excess(result.memory, threshold))
    elif result.outcome in NOT_SERVED:
        out["startup"] = 1.0
        out["memory"] = min(out["memory"], 0.0)
    m = result.metrics
    if result.outcome == Outcome.PRUNED:
        # Stopped as hopeless: never feasible; the SLO part says how far it was when stopped.
        ratios = [(m.get(metric) or 0.0) / limit - 1.0 for metric, limit in scenario.slos.items()]
        out["slo"] = max(min(max(ratios), 10.0), 1e-3) if ratios else 1e-3
    if result.outcome == Outcome.OK:
        out["requests"] = result.failed_share - MAX_FAILED_SHARE
        ratios = [(m.get(metric) or math.inf) / limit - 1.0 for metric, limit in scenario.slos.items()]
        out["slo"] = min(max(ratios), 10.0) if ratios else -1.0
    return out


def feasible(constraints: Mapping[str, float]) -> bool:
    return all(v <= 0 for v in constraints.values())


def counts_against_budget(user_attrs: Mapping[str, object]) -> bool:
    """Whether a completed trial (by its user attributes) is one of the study's engine runs: launched
    (not rejected before launch) and the search's, not the trust phase's."""
    return bool(user_attrs.get("launched", True)) and user_attrs.get("kind") not in AFTER_SEARCH
