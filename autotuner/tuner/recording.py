"""Tell and write: a finished trial's constraints and objectives to Optuna, its whole result to our
own tables, and its event to the live view — in the order that loses at most the trial in flight
when the tuner is killed between two writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
import structlog
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.secrets import redact_value
from autotuner.store.db import Store, TrialRecord
from autotuner.trials.outcomes import Outcome, TrialKind
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import WORST_LATENCY_S, constraints_of, feasible
from autotuner.vllm import FlagValue

log = structlog.get_logger(__name__)

Event = Callable[[str, dict[str, Any]], None]


def set_attr(trial: optuna.Trial, name: str, value: Any) -> None:
    """A user attribute in Optuna's own tables (trial_user_attributes), masked like our rows: an engine's
    failure reason may quote its environment or a URL with a password."""
    trial.set_user_attr(name, redact_value(value))


@dataclass
class TrialRecorder:
    scenario: Scenario
    store: Store
    study_name: str
    on_event: Event

    @property
    def objectives(self) -> list[str]:
        return [o.metric for o in self.scenario.objectives]

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.scenario.objectives]

    def tell(self, study: optuna.Study, trial: optuna.Trial, kind: str, result: TrialResult, started: float) -> None:
        """A measured (or screened) trial: FAIL for the machine's faults, else COMPLETE with its constraints."""
        if result.infrastructure:
            set_attr(trial, "outcome", result.outcome)
            set_attr(trial, "reason", result.reason)
            study.tell(trial, state=TrialState.FAIL)
            self.save(trial.number, kind, result, "FAIL", started)
            self.on_event("finished", {"number": trial.number, "outcome": result.outcome, "state": "FAIL",
                                       "reason": result.reason, "kind": kind, "peak_fraction": result.peak_fraction})
            return
        constraints = constraints_of(result, self.scenario)
        ok = feasible(constraints)
        values = [result.metric(metric) for metric in self.objectives]
        if not ok or any(v is None for v in values):
            values = self.placeholders(study)
            ok = False
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        attrs = {"kind": kind, "outcome": result.outcome, "reason": result.reason, "feasible": ok,
                 "constraints": constraints, "peak_fraction": result.peak_fraction,
                 **{f"metric:{k}": v for k, v in result.metrics.items() if isinstance(v, int | float)}}
        for name, value in attrs.items():
            set_attr(trial, name, value)
        # Ours first: if we die between the two writes, the resumed run finds the trial RUNNING, drops
        # our row and measures the candidate again — nothing duplicated, at most this trial lost.
        # A twin finalist keeps what the twin predicted beside what was measured (the certificate's twin error).
        predicted = trial.user_attrs.get("twin_predicted") if kind == TrialKind.TWIN else None
        self.save(trial.number, kind, result, "COMPLETE", started,
                  {"twin_predicted": predicted} if isinstance(predicted, int | float) else None)
        study.tell(trial, values=[float(v) for v in values])  # type: ignore[arg-type]
        log.info("trial.finished", study=self.study_name, number=trial.number, kind=kind, outcome=result.outcome,
                 feasible=ok, flags=result.flags, reason=result.reason,
                 **{m: result.metric(m) for m in self.objectives}, peak_fraction=result.peak_fraction)
        self.on_event("finished", {"number": trial.number, "outcome": result.outcome, "feasible": ok,
                                   "values": values, "state": "COMPLETE", "reason": result.reason,
                                   "flags": result.flags, "kind": kind, "metrics": result.metrics,
                                   "peak_fraction": result.peak_fraction, "constraints": constraints})

    def placeholders(self, study: optuna.Study) -> list[float]:
        """Worst feasible values so far: the sampler learns the wall without a fake optimum."""
        feasible_values = [t.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                           if t.user_attrs.get("feasible")]
        out = []
        for i, direction in enumerate(self.directions):
            seen = [v[i] for v in feasible_values]
            if direction == "maximize":
                out.append(min(seen) if seen else 0.0)
            else:
                out.append(max(seen) if seen else WORST_LATENCY_S)
        return out

    def save(self, number: int, kind: str, result: TrialResult, state: str, started: float,
             extra: dict[str, object] | None = None) -> None:
        data = {**result.to_dict(), **(extra or {})}
        timeline = (data.get("memory") or {}).get("timeline") or []  # type: ignore[attr-defined]
        self.store.save_trial(self.study_name, TrialRecord(
            trial_number=number, kind=kind, outcome=result.outcome, reason=result.reason, state=state,
            flags=result.flags, result=data, timeline=timeline, log_tail=result.log_tail,
            started_at=started, finished_at=time.time()))

    def interrupted(self, study: optuna.Study, trial: optuna.Trial, kind: str, flags: dict[str, FlagValue],
                    started: float) -> None:
        """Stopped before it was measured: FAIL, and the candidate queued again for the resumed study."""
        trial.set_user_attr("kind", kind)
        trial.set_user_attr("outcome", Outcome.INTERRUPTED)
        study.tell(trial, state=TrialState.FAIL)
        # The interrupted candidate is measured again when the study resumes.
        study.enqueue_trial(trial.params, user_attrs={"kind": kind, "requeued_from": trial.number})
        result = TrialResult(Outcome.INTERRUPTED, "the tuner was asked to stop",
                             {**self.scenario.engine.flags, **flags}, [])
        self.save(trial.number, kind, result, "FAIL", started)
        self.on_event("finished", {"number": trial.number, "outcome": Outcome.INTERRUPTED, "state": "FAIL"})

    def gpus_busy(self, study: optuna.Study, trial: optuna.Trial, kind: str, flags: dict[str, FlagValue],
                  reason: str, started: float) -> None:
        """Never launched, the GPUs were taken: end the trial (not RUNNING forever), queue the candidate again."""
        set_attr(trial, "outcome", Outcome.GPUS_BUSY)
        set_attr(trial, "reason", reason)
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"kind": kind, "requeued_from": trial.number})
        self.save(trial.number, kind, TrialResult(Outcome.GPUS_BUSY, reason, {**self.scenario.engine.flags, **flags},
                                                  []), "FAIL", started)
