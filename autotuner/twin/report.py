"""What the twin of a stored study says: its calibrated box parameters with their intervals, its
prediction against every measured trial, and its error, for `autotuner twin STUDY` and the certificate.

Two errors, because they answer different questions: the *finalists'* error compares what the twin
predicted when it queued a candidate with what the engine then measured (out of sample: how far to
trust its ranking), the *fit* error compares the final calibration with every measured trial (in
sample: how well three box parameters explain this box).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import TrialKind
from autotuner.twin.box import EngineFactory, twin_box
from autotuner.twin.calibrate import calibrate, observations
from autotuner.twin.params import BoxParams
from autotuner.twin.production import PRODUCTION, stored

METRICS = ("output_tokens_per_s", "ttft_p95_s", "tpot_p50_s")


@dataclass(frozen=True)
class TrialRow:
    number: int
    kind: str
    outcome: str
    measured: dict[str, float]
    predicted: dict[str, float]  # the final calibration's, bias-corrected as the search sees it
    queued_prediction: float | None  # a finalist's objective as predicted when the twin queued it

    def error(self, metric: str) -> float | None:
        m, p = self.measured.get(metric), self.predicted.get(metric)
        return p / m - 1 if m and p else None


@dataclass
class TwinReport:
    study: str
    preset: str | None
    why_none: str | None  # no twin for this study, and why
    params: BoxParams | None = None
    rows: list[TrialRow] = field(default_factory=list)
    objective: str = "output_tokens_per_s"

    @property
    def fit_error_p50(self) -> float | None:
        # Production's throughput is its arrival rate's: no test of the twin.
        errors = [abs(e) for r in self.rows if r.kind != PRODUCTION and (e := r.error(self.objective)) is not None]
        return statistics.median(errors) if errors else None

    @property
    def finalists_error_p50(self) -> float | None:
        errors = [abs(r.queued_prediction / m - 1) for r in self.rows
                  if r.queued_prediction and (m := r.measured.get(self.objective))]
        return statistics.median(errors) if errors else None

    def as_dict(self) -> dict[str, Any]:
        return {"study": self.study, "preset": self.preset, "why_none": self.why_none,
                "params": self.params.as_dict() if self.params else None, "objective": self.objective,
                "fit_error_p50": self.fit_error_p50, "finalists_error_p50": self.finalists_error_p50,
                "trials": [{"number": r.number, "kind": r.kind, "outcome": r.outcome, "measured": r.measured,
                            "predicted": r.predicted, "queued_prediction": r.queued_prediction}
                           for r in self.rows]}


def twin_report(store: Store, study: str, make_engine: EngineFactory) -> TwinReport:
    record = store.study(study)
    if record is None:
        raise UserInputError(f"no study {study!r} in {store.url}: `autotuner status` lists them")
    scenario = Scenario.model_validate(record.scenario)
    box = twin_box(scenario, record.key.gpu_inventory, make_engine)
    if isinstance(box, str):
        return TwinReport(study, None, box)
    trials = store.trials(study)
    # What the twin predicted when it queued a finalist is the trial's user attribute in the study, and
    # production's served window (in the daemon) the study's.
    optuna_study = optuna.load_study(study_name=study, storage=store.optuna_storage())
    obs = stored(optuna_study.user_attrs) + observations(trials)
    objective = scenario.objectives[0].metric
    report = TwinReport(study, box.preset.name, None, objective=objective)
    if not obs:
        report.why_none = "no measured trial yet: nothing to calibrate on"
        return report
    calibration = calibrate(box, obs)
    report.params = calibration.params
    queued = {t.number: t.user_attrs.get("twin_predicted") for t in optuna_study.get_trials(deepcopy=False)}
    for o in obs:
        predicted = box.predict(o.flags, calibration.params, o.workload).metrics
        bias = calibration.bias if o.workload is None else {}
        corrected = {m: float(v) * bias.get(m, 1.0) for m in METRICS
                     if isinstance(v := predicted.get(m), int | float)}
        guess = queued.get(o.number) if o.kind == TrialKind.TWIN else None
        report.rows.append(TrialRow(o.number, o.kind, o.outcome, {m: o.metrics[m] for m in METRICS if m in o.metrics},
                                    corrected, float(guess) if isinstance(guess, int | float) else None))
    return report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def render(report: TwinReport) -> list[str]:
    """The report as terminal lines."""
    if report.params is None:
        return [f"study {report.study}: no twin — {report.why_none}"]
    p = report.params
    lines = [f"study {report.study}: twin of {report.preset}, calibrated on {p.fitted_on} measured trial(s)",
             "box parameters (value, 95 % interval; the preset is 1.0 / 0):"]
    for name, est, unit in (("compute efficiency", p.compute_efficiency, "×"),
                            ("bandwidth efficiency", p.bandwidth_efficiency, "×"),
                            ("step overhead", p.step_overhead_s, "s"),
                            ("non-torch memory", p.non_torch_gib, "GiB"),
                            ("transient scale", p.transient_scale, "×")):
        lines.append(f"  {name:22s} {est.value:8.4g} {unit:3s} [{est.low:.4g} – {est.high:.4g}]")
    lines.append(f"{'#':>4} {'kind':10s} {'outcome':14s} {'out tok/s meas':>14s} {'twin':>8s} {'err':>7s} "
                 f"{'TTFT p95 meas':>13s} {'twin':>7s} {'queued at':>10s}")
    for r in report.rows:
        m, q = r.measured, r.queued_prediction
        number = str(r.number) if r.number >= 0 else "-"  # production's window is no trial
        lines.append(f"{number:>4} {r.kind:10s} {r.outcome:14s} {_num(m.get('output_tokens_per_s')):>14s} "
                     f"{_num(r.predicted.get('output_tokens_per_s')):>8s} {_pct(r.error('output_tokens_per_s')):>7s} "
                     f"{_num(m.get('ttft_p95_s'), 's'):>13s} {_num(r.predicted.get('ttft_p95_s'), 's'):>7s} "
                     f"{_num(q):>10s}")
    lines.append(f"twin error on {report.objective}: fit p50 {_abs(report.fit_error_p50)} (final calibration, "
                 f"every measured trial); finalists p50 {_abs(report.finalists_error_p50)} (predicted when queued)")
    return lines


def _num(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.1f}{unit}" if x >= 10 else f"{x:.2f}{unit}"


def _abs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"
