"""The study's budget: which trials count against it (engine runs of the search, not candidates
rejected before launch, not re-measurements), and why no further trial may start now (the budget,
the time, a space with nothing left worth launching, or the circuit breaker).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import optuna
import structlog
from optuna.trial import TrialState

from autotuner.trials.scoring import counts_against_budget
from autotuner.tuner.breaker import CircuitBreaker

log = structlog.get_logger(__name__)

# Candidates rejected before launch (flag rules, the wall) do not use up the budget of engine runs;
# this many in a row means the space left has nothing worth launching.
MAX_FREE_IN_A_ROW = 30


def launched_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that ran an engine: what the budget counts."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if counts_against_budget(t.user_attrs)]


@dataclass
class Budget:
    study_name: str
    n_trials: int
    deadline: float | None  # time.monotonic()
    breaker: CircuitBreaker
    free_in_a_row: int = 0

    def ended(self, launched: bool) -> None:
        """A trial ended: an engine run resets the count of candidates rejected in a row."""
        self.free_in_a_row = 0 if launched else self.free_in_a_row + 1

    def why_end(self, started: int) -> str | None:
        """Why no further trial may start now, `started` engine runs in (None: one may)."""
        if started >= self.n_trials:
            return "budget"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            log.info("tune.timeout", study=self.study_name)
            return "timeout"
        if self.free_in_a_row >= MAX_FREE_IN_A_ROW:
            log.warning("tune.space_exhausted", study=self.study_name, rejected_in_a_row=self.free_in_a_row)
            return "space-exhausted"
        if self.breaker.tripped is not None:
            log.error("tune.stopped", study=self.study_name, reason=self.breaker.tripped)
            return "stopped"
        return None
