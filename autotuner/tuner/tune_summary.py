"""`TuneSummary`: how a study run ended and what it found, for `tune`'s closing lines, its exit
status and the daemon's cycle; `summarize` reads it off the study once the loop has ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
import structlog
from optuna.trial import TrialState

from autotuner.trials.outcomes import OOM_OUTCOMES, TrialKind
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.groups import GpuGroup
from autotuner.tuner.space import Space

log = structlog.get_logger(__name__)


@dataclass
class TuneSummary:
    study_name: str
    trials_done: int
    trials_budget: int
    oom_trials: int
    interrupted: bool  # SIGINT/SIGTERM only
    best: list[dict[str, Any]] = field(default_factory=list)  # feasible Pareto trials
    baseline: dict[str, Any] | None = None
    sampler: str = ""
    stopped_reason: str | None = None  # the circuit breaker stopped the run, and why
    ended: str = "budget"  # budget | timeout | space-exhausted | twin-converged | interrupted | stopped
    gpu_groups: list[str] = field(default_factory=list)  # trials side by side: each group's GPUs
    twin: str = ""  # what the calibrated twin did (autotuner.twin), or why there was none

    @property
    def exit_code(self) -> int:
        """`tune`'s exit status: 1 when the breaker stopped the run; else 0 — the budget or the time ran
        out, or SIGINT/SIGTERM ended it cleanly (the summary says interrupted; the next run resumes)."""
        return 1 if self.stopped_reason is not None else 0


def group_labels(groups: list[GpuGroup]) -> list[str]:
    """Each group's GPUs when trials run side by side; nothing when one trial runs at a time."""
    return [g.label() for g in groups] if len(groups) > 1 else []


def summarize(study: optuna.Study, space: Space, *, study_name: str, n_trials: int, sampler: str, ended: str,
              stopped_reason: str | None, groups: list[GpuGroup], twin: str = "") -> TuneSummary:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ooms = sum(1 for t in complete if t.user_attrs.get("outcome") in OOM_OUTCOMES)
    best = [{"number": t.number, "values": t.values, "params": space.to_flags(t.params)}
            for t in study.best_trials if t.user_attrs.get("feasible")]
    baseline = next(({"number": t.number, "outcome": t.user_attrs.get("outcome"), "values": t.values}
                     for t in complete if t.user_attrs.get("kind") == TrialKind.BASELINE), None)
    summary = TuneSummary(study_name, len(launched_trials(study)), n_trials, ooms, ended == "interrupted", best,
                          baseline, sampler, stopped_reason if ended == "stopped" else None, ended,
                          group_labels(groups), twin)
    log.info("tune.finished", study=study_name, trials=summary.trials_done, oom_trials=ooms,
             not_launched=len(complete) - summary.trials_done,
             pareto=len(best), ended=ended, stopped_reason=summary.stopped_reason)
    return summary
