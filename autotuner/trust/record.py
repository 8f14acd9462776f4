"""A trust measurement stored like a search trial: an Optuna trial (so optuna-dashboard shows it, with
`kind` and the trial it `confirms` / `soaks` / `backs_off` as user attributes) and our `at_trials` row.

Added with `study.add_trial` as a finished trial: it never goes through `ask`, so it cannot take the
place of a trial queued for the search, and `launched_trials` leaves it out of the trial budget.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.store.db import Store, TrialRecord
from autotuner.trials.outcomes import TrialKind
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import WORST_LATENCY_S, constraints_of, feasible
from autotuner.tuner.space import Space

# The user attribute and result key naming the trial a trust run is about.
LINKS = {TrialKind.CONFIRM: "confirms", TrialKind.SOAK: "soaks", TrialKind.BACKOFF: "backs_off"}


def placeholders(study: optuna.Study, directions: list[str]) -> list[float]:
    """Worst feasible values so far, as the study loop tells for an infeasible trial."""
    seen = [t.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("feasible")]
    out = []
    for i, direction in enumerate(directions):
        column = [v[i] for v in seen]
        out.append((min(column) if column else 0.0) if direction == "maximize"
                   else (max(column) if column else WORST_LATENCY_S))
    return out


def record(study: optuna.Study, store: Store, scenario: Scenario, space: Space, *, kind: str, original: int,
           params: dict[str, Any], result: TrialResult, started: float, extra: dict[str, Any]) -> int:
    """Store one trust run; returns its trial number."""
    objectives = [o.metric for o in scenario.objectives]
    constraints = constraints_of(result, scenario)
    ok = feasible(constraints)
    values = [result.metrics.get(m) for m in objectives]
    if not ok or any(not isinstance(v, int | float) for v in values):
        values = placeholders(study, [o.direction for o in scenario.objectives])
        ok = False
    tag = uuid.uuid4().hex
    link = LINKS[TrialKind(kind)]
    attrs = {"kind": kind, link: original, "launched": True, "trust_id": tag, "outcome": result.outcome,
             "reason": result.reason, "feasible": ok, "constraints": constraints,
             "peak_fraction": result.memory.get("peak_fraction"),
             **{f"metric:{k}": v for k, v in result.metrics.items() if isinstance(v, int | float)}}
    distributions = {k: v for k, v in space.distributions.items() if k in params}
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=distributions, values=[float(v) for v in values],  # type: ignore[arg-type]
        user_attrs=attrs, constraints=constraints))
    number = next(t.number for t in reversed(study.get_trials(deepcopy=False))
                  if t.user_attrs.get("trust_id") == tag)
    data = {**result.to_dict(), link: original, **extra}
    timeline = (data.get("memory") or {}).get("timeline") or []  # type: ignore[union-attr]
    store.save_trial(study.study_name, TrialRecord(
        trial_number=number, kind=kind, outcome=result.outcome, reason=result.reason, state="COMPLETE",
        flags=result.flags, result=data, timeline=timeline, log_tail=result.log_tail, started_at=started,
        finished_at=time.time()))
    return number
