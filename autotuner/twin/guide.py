"""Twin-first search, as the study loop uses it: before each engine run, calibrate the twin on every
trial measured so far, search it, and queue the best candidate not yet measured (kind `twin`, with what
the twin predicted for it); say the search is over when the twin's last finalists came out as it
predicted and it predicts nothing better than the best measured.

Queued trials rather than an Optuna sampler: the twin needs what a sampler never sees (the memory peaks,
the KV cache size vLLM logged, every trial's latency percentiles, in our store), the screening and the
memory model still check each candidate before launch, and the study's own sampler (GP or TPE) stays
as it was for the fallback — when the twin stays wrong, the loop goes on exactly as it does without one.

State lives in the study: a trial's kind and prediction are its user attributes, calibration is
recomputed from the stored trials, so a resumed study continues where it was.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
import structlog
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import OOM_OUTCOMES, Outcome, TrialKind
from autotuner.trials.scoring import counts_against_budget
from autotuner.twin.box import EngineFactory, TwinBox, twin_box
from autotuner.twin.calibrate import Calibration, calibrate, observations
from autotuner.twin.params import PRIOR, BoxParams
from autotuner.twin.production import PRODUCTION, stored
from autotuner.twin.search import Candidate, SearchSpace, TwinSearch, key_of

log = structlog.get_logger(__name__)

# The twin is wrong when its last predictions missed the measurement by more than this (median |error|
# of its last three finalists, two at least): beyond the simulator's own spread against published runs
# (8–15 %, benchmarks/sim_accuracy.py), after calibration on this very box.
ERROR_BOUND = 0.15
# It has converged when its last two finalists came within this of its prediction (about twice the
# run-to-run noise) and nothing unmeasured is predicted better than the best measured by CONVERGE_MARGIN.
CONVERGE_ERROR = 0.06
CONVERGE_MARGIN = 0.02
MIN_FINALISTS = 2
MAX_TWIN_OOMS = 2  # finalists that ran out of memory: its memory wall is wrong here
CONVERGED = "twin-converged"


@dataclass
class TwinGuide:
    scenario: Scenario
    space: SearchSpace
    store: Store
    study_name: str
    box: TwinBox | None
    off_reason: str | None = None
    prior: BoxParams = PRIOR
    calibration: Calibration | None = None
    finalists: list[dict[str, Any]] = field(default_factory=list)  # number, predicted, measured, error
    production: int = 0  # production's served windows it was calibrated on too (the daemon's)

    @classmethod
    def for_study(cls, scenario: Scenario, space: SearchSpace, store: Store, study_name: str, inventory: Sequence[str],
                  make_engine: EngineFactory, *, enabled: bool = True, prior: BoxParams = PRIOR) -> TwinGuide:
        if not enabled:
            return cls(scenario, space, store, study_name, None)  # not asked for: the summary says nothing
        box = twin_box(scenario, inventory, make_engine)
        if isinstance(box, str):
            return cls(scenario, space, store, study_name, None, box)
        return cls(scenario, space, store, study_name, box, prior=prior)

    @property
    def active(self) -> bool:
        return self.box is not None and self.off_reason is None

    def next(self, study: optuna.Study) -> str | None:
        """Queue the twin's next finalist; CONVERGED when the search is over; None otherwise (nothing
        queued: the loop's own next candidate)."""
        if not self.active or self.box is None:
            return None
        trials = study.get_trials(deepcopy=False)
        launched = any(t.state == TrialState.COMPLETE and counts_against_budget(t.user_attrs) for t in trials)
        if any(t.state == TrialState.WAITING for t in trials) or not launched:
            return None  # the baseline (and other queued references) first
        records = self.store.trials(self.study_name)
        self.finalists = self._finalists(trials, {r.trial_number: r for r in records})
        why_off = self._wrong()
        if why_off is not None:
            self.off_reason = why_off
            log.warning("twin.off", study=self.study_name, reason=why_off)
            return None
        served = stored(study.user_attrs)
        self.production = len(served)
        obs = served + observations(records)
        if not obs:
            return None
        self.calibration = calibrate(self.box, obs, self.prior,
                                     self.calibration.params if self.calibration else None)
        search = TwinSearch(self.box, self.scenario, self.space, self.calibration)
        measured = [self.space.clamp(o.flags) for o in obs if o.kind != PRODUCTION]
        # Every point tried (screened ones too: the memory model refused them) or about to be.
        pending = [dict(t.params) for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING,
                                                                 TrialState.COMPLETE)]
        ranked = search.run(extra=measured)
        taken = {key_of(p) for p in measured + pending}
        # The best the twin ranks among those measured within the SLOs: what the search would end on.
        held = {key_of(dict(t.params)) for t in trials
                if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")}
        best_measured = next((c for c in ranked if c.key in held), None)
        nxt = next((c for c in ranked if c.key not in taken), None)
        if self._converged(search, best_measured, nxt):
            probe = self._unsure(search, best_measured, taken)
            if probe is not None:
                study.enqueue_trial(probe.params, user_attrs={**self._attrs(probe), "twin_probe": True})
                log.info("twin.probe", study=self.study_name, flags=probe.flags, predicted=probe.value,
                         note="could beat the best measured within the calibration's uncertainty")
                return None
            log.info("twin.converged", study=self.study_name, finalists=len(self.finalists))
            return CONVERGED
        if nxt is None and not ranked:
            nxt = search.nearest_feasible(taken)  # nothing predicted feasible: learn where the edge is
        if nxt is None:
            return None
        study.enqueue_trial(nxt.params, user_attrs=self._attrs(nxt))
        log.info("twin.queued", study=self.study_name, flags=nxt.flags, predicted=nxt.value,
                 error_p50=self.calibration.error_p50)
        return None

    def _attrs(self, c: Candidate) -> dict[str, Any]:
        thr = c.result.metrics.get("output_tokens_per_s")
        return {"kind": TrialKind.TWIN, "twin_predicted": c.value, "twin_predicted_thr": thr,
                "twin_feasible": c.feasible,
                # served trials the calibration had: a prediction from the prior alone is no test of the twin
                "twin_evidence": self.calibration.served if self.calibration else 0,
                "twin_margin_gib": None if c.margin_bytes == float("inf") else round(c.margin_bytes / 2**30, 3)}

    def _finalists(self, trials: Sequence[optuna.trial.FrozenTrial], records: dict[int, Any]) -> list[dict[str, Any]]:
        metric = self.scenario.objectives[0].metric
        out = []
        for t in trials:
            if t.user_attrs.get("kind") != TrialKind.TWIN or t.state != TrialState.COMPLETE:
                continue
            record = records.get(t.number)
            if record is None or not t.user_attrs.get("launched", True):
                continue
            if record.outcome == Outcome.PRUNED:
                # Stopped early because `keep` measured trials already beat its optimistic bound: no
                # full figure to compare, and often one within noise of the best (counted as a 100 %
                # miss, two such turned a twin off whose measured finalists were within 3 %).
                continue
            predicted = t.user_attrs.get("twin_predicted")
            measured = record.metrics.get(metric) if record.outcome == Outcome.OK else None
            if isinstance(predicted, int | float) and isinstance(measured, int | float) and measured:
                error = predicted / measured - 1
            elif t.user_attrs.get("twin_feasible", True) or record.outcome in OOM_OUTCOMES:
                error = 1.0  # predicted to serve within the SLOs (and the memory); it did not
            else:
                continue  # queued as the nearest to feasible: its miss was predicted
            out.append({"number": t.number, "predicted": predicted, "measured": measured, "error": error,
                        "outcome": record.outcome, "calibrated": bool(t.user_attrs.get("twin_evidence", 1))})
        return out

    def _wrong(self) -> str | None:
        recent = [abs(f["error"]) for f in self.finalists if f["calibrated"]][-3:]
        if len(recent) >= 2 and statistics.median(recent) > ERROR_BOUND:
            return (f"its last {len(recent)} finalists missed their predictions by a median "
                    f"{statistics.median(recent):.0%} (> {ERROR_BOUND:.0%} after calibration): searching as without it")
        ooms = sum(f["outcome"] in OOM_OUTCOMES for f in self.finalists)
        if ooms >= MAX_TWIN_OOMS:
            return f"{ooms} of its finalists ran out of memory: searching as without it"
        return None

    def _converged(self, search: TwinSearch, best_measured: Candidate | None, nxt: Candidate | None) -> bool:
        if len(self.finalists) < MIN_FINALISTS or best_measured is None:
            return False
        recent = [abs(f["error"]) for f in self.finalists if f["calibrated"]][-2:]
        if len(recent) < MIN_FINALISTS or max(recent) > CONVERGE_ERROR:
            return False
        if nxt is None or nxt.value is None or best_measured.value is None:
            return True
        # In the twin's own frame (its bias cancels): is anything unmeasured predicted better?
        gain = nxt.value / best_measured.value - 1 if best_measured.value else 0.0
        if search.objective.direction == "minimize":
            gain = -gain
        return gain <= CONVERGE_MARGIN

    def _unsure(self, search: TwinSearch, best: Candidate | None, taken: set[str]) -> Candidate | None:
        """The unmeasured candidate that could most plausibly beat the best measured by more than
        CONVERGE_MARGIN (None: nothing could): a finalist's prediction can come true while the box's
        parameters stay loose along a direction the measured trials never tested."""
        if best is None:
            return None
        scored = [(g, c) for c in search.contenders(taken)
                  if (g := search.optimistic_gain(c, best)) is not None and g > math.log1p(CONVERGE_MARGIN)]
        return max(scored, key=lambda gc: gc[0])[1] if scored else None

    def describe(self) -> str:
        """One line for the summary: what the twin did, or why there was none."""
        if self.box is None:
            return f"twin: none — {self.off_reason}" if self.off_reason else ""
        errors = [abs(f["error"]) for f in self.finalists]
        err = f", finalists' error p50 {statistics.median(errors):.1%}" if errors else ""
        if self.off_reason is not None:
            return f"twin: off — {self.off_reason}{err}"
        prod = f", calibrated on production's /metrics too ({self.production} window)" if self.production else ""
        return f"twin: {self.box.preset.name}, guided {len(self.finalists)} engine run(s){err}{prod}"
