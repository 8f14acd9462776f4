"""Fitting the twin's box parameters to what the box measured.

Memory first, each from its own evidence: the non-torch memory from the KV cache size vLLM logged at
startup (the twin plans more tokens than the engine got: the gap, in GiB, is memory the twin did not
know of), then the transient scale from the measured peaks (linear in the scale: two predictions give
slope and intercept), raised where a measured OOM says the transient must be larger. Then performance:
a maximum a posteriori fit of (log compute efficiency, log bandwidth efficiency, step overhead) to the
log ratios of measured to predicted throughput, TTFT p50 and TPOT p50 (Gauss-Newton with the priors of
params.py as extra residuals; forward differences, a few iterations), its 95 % intervals from the
posterior's curvature. Each prediction is one virtual-time evaluation (~50 ms), so a fit costs seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import OOM_OUTCOMES, Outcome
from autotuner.trials.result import TrialResult
from autotuner.twin.box import TwinBox
from autotuner.twin.params import (
    NON_TORCH_PRIOR_SIGMA_GIB,
    PRIOR,
    PRIOR_SIGMA,
    TRANSIENT_PRIOR_SIGMA,
    BoxParams,
    Estimate,
)

# Relative measurement error a residual is weighed by: run-to-run spread of throughput and TPOT is
# ~3 % (sim/noise.py, TUNA); TTFT p50 carries queueing, which amplifies it.
METRIC_SIGMA = {"output_tokens_per_s": 0.04, "tpot_p50_s": 0.04, "ttft_p50_s": 0.10}
# Forward-difference steps of the performance vector (log, log, seconds).
STEPS = (0.04, 0.04, 2e-4)
ITERATIONS = 3
MAX_STEP = np.array([0.5, 0.5, 2e-3])
MAX_PERF_TRIALS = 8  # the latest ones; older evidence is already in the priors it moved
MAX_MEMORY_TRIALS = 4
# One run's peak beyond the twin's, run to run (allocator fragmentation: the simulator draws 0–384 MiB)
# and the prior on the offset every run of this box carries.
PEAK_RUN_SIGMA_BYTES = 128 * 2**20
PEAK_OFFSET_PRIOR_BYTES = 512 * 2**20
Z95 = 1.96


@dataclass(frozen=True)
class Observation:
    """One measured trial (or production's served window: twin/production.py), as the twin uses it."""

    number: int
    kind: str
    flags: dict[str, object]
    outcome: str
    metrics: dict[str, float]
    peak_bytes: int | None
    limit_fraction_total: int | None  # the card's total bytes (to place an OOM's bound)
    kv_cache_tokens: int | None
    # The workload it ran (the scenario's workload settings as JSON); None: the study's own.
    workload: dict[str, Any] | None = None
    # Relative error per metric where it is not METRIC_SIGMA's (a p50 read from a coarse histogram).
    sigma: dict[str, float] | None = None

    @property
    def served(self) -> bool:
        return self.outcome == Outcome.OK and bool(self.metrics.get("output_tokens_per_s") or self.workload)

    def sigma_of(self, metric: str) -> float:
        return (self.sigma or {}).get(metric, METRIC_SIGMA[metric])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Observation:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


def observations(trials: Iterable[TrialRecord]) -> list[Observation]:
    """The launched, measured trials of a study (screened candidates and infrastructure failures are no
    evidence of the box)."""
    out = []
    for t in trials:
        if t.state not in ("COMPLETE", "PRUNED") or not t.result.get("argv") or t.result.get("infrastructure"):
            continue
        peaks = t.memory.get("peak_bytes") or []
        totals = t.memory.get("total_bytes") or []
        metrics = {k: float(v) for k, v in t.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        kv = t.engine.get("kv_cache_tokens")
        out.append(Observation(t.trial_number, t.kind, dict(t.flags), t.outcome, metrics,
                               int(max(peaks)) if peaks else None, int(max(totals)) if totals else None,
                               int(kv) if isinstance(kv, int | float) and kv else None))
    return out


@dataclass(frozen=True)
class TrialFit:
    number: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


@dataclass(frozen=True)
class PeakFit:
    """What the measured peaks say beyond the transient scale: the offset every run carries, the
    covariance of (scale, offset) and one run's own spread, in bytes."""

    offset_bytes: float
    cov: np.ndarray = field(compare=False)
    run_sigma_bytes: float

    def sigma_bytes(self, slope: float) -> float:
        """The standard deviation of a predicted peak whose transient moves `slope` bytes per unit of
        scale: the fit's uncertainty there plus one run's spread."""
        v = np.array([slope, 1.0])
        return math.sqrt(max(0.0, float(v @ self.cov @ v)) + self.run_sigma_bytes**2)


@dataclass(frozen=True)
class Calibration:
    params: BoxParams
    fits: tuple[TrialFit, ...]  # throughput predicted (with the fitted params) against measured
    peak: PeakFit  # the memory peak's fit: offset and uncertainty
    # measured / predicted per metric (geometric median over the served trials, fitted params): what the
    # three box parameters cannot say (a tail percentile's queueing, a curve no scalar fits), corrected.
    bias: dict[str, float] = field(default_factory=dict)
    # Posterior covariance of the performance vector (params.PERF, as fitted: log, log, seconds); None
    # when no served trial informed it (the prior's own then).
    perf_cov: tuple[tuple[float, ...], ...] | None = None
    served: int = 0  # observations the performance fit stood on (production's window among them)

    def perf_covariance(self) -> np.ndarray:
        if self.perf_cov is not None:
            return np.array(self.perf_cov, dtype=float)
        return np.diag(np.array(_prior_sigma(self.params), dtype=float) ** 2)

    @property
    def error_p50(self) -> float | None:
        errors = [abs(f.error) for f in self.fits]
        return statistics.median(errors) if errors else None


def calibrate(box: TwinBox, obs: Sequence[Observation], prior: BoxParams = PRIOR,
              start: BoxParams | None = None) -> Calibration:
    """The box parameters that explain `obs`, pulled towards `prior`; the performance fit starts from
    `start` (the last calibration: one more trial moves it little, so one or two steps suffice)."""
    params = replace(prior, notes=[])
    params = _fit_non_torch(box, obs, params)
    params, peak = _fit_transient(box, obs, params)
    # Observations on a workload of their own (production's) are kept whatever their age; of the study's
    # trials the latest.
    served = [o for o in obs if o.served and o.workload is not None] + \
        [o for o in obs if o.served and o.workload is None][-MAX_PERF_TRIALS:]
    cov = None
    if served:
        params, cov = _fit_perf(box, served, params, prior, start)
    params = replace(params, fitted_on=len(obs))
    fits = []
    ratios: dict[str, list[float]] = {}
    for o in served:
        if o.workload is not None:
            # Production's throughput is mostly its arrival rate's (no test of the twin), and the bias
            # corrects predictions of the study's workload: both from the study's own trials.
            continue
        predicted = box.predict(o.flags, params).metrics
        guess = predicted.get("output_tokens_per_s")
        if guess:
            fits.append(TrialFit(o.number, o.metrics["output_tokens_per_s"], float(guess)))
        for name, measured in o.metrics.items():
            value = predicted.get(name)
            if measured > 0 and isinstance(value, int | float) and value > 0:
                ratios.setdefault(name, []).append(math.log(measured / value))
    # Shrunk towards 1 by one pseudo-observation: a single trial's noise is not a bias.
    bias = {name: math.exp(statistics.median(logs) * len(logs) / (len(logs) + 1)) for name, logs in ratios.items()}
    return Calibration(params, tuple(fits), peak, bias,
                       None if cov is None else tuple(tuple(float(x) for x in row) for row in cov), len(served))


def _fit_non_torch(box: TwinBox, obs: Sequence[Observation], params: BoxParams) -> BoxParams:
    logged = [o for o in obs if o.kv_cache_tokens][-MAX_MEMORY_TRIALS:]
    gaps = []
    for o in logged:
        zero = _with(params, non_torch_gib=0.0)
        a = box.predict(o.flags, zero).engine.get("kv_cache_tokens")
        b = box.predict(o.flags, _with(params, non_torch_gib=1.0)).engine.get("kv_cache_tokens")
        if isinstance(a, int) and isinstance(b, int) and a > b and o.kv_cache_tokens:
            gaps.append((a - o.kv_cache_tokens) / (a - b))  # GiB the twin did not know of
    if not gaps:
        return params
    value = max(0.0, statistics.median(gaps))
    spread = statistics.pstdev(gaps) if len(gaps) > 1 else 0.05
    sigma = 1 / math.sqrt(1 / NON_TORCH_PRIOR_SIGMA_GIB**2 + len(gaps) / max(spread, 0.02) ** 2)
    return _with_estimate(params, "non_torch_gib", Estimate(value, max(0.0, value - Z95 * sigma), value + Z95 * sigma))


def _peak(result: TrialResult) -> int | None:
    peaks = result.memory.get("peak_bytes")
    return int(max(peaks)) if isinstance(peaks, list) and peaks else None


def _fit_transient(box: TwinBox, obs: Sequence[Observation], params: BoxParams) -> tuple[BoxParams, PeakFit]:
    """Peak = intercept + slope × scale + offset for each measured trial (intercept and slope from two
    predictions: the peak is linear in the scale); (scale, offset) by maximum a posteriori, raised to
    what each measured OOM needs. Least squares weighs a trial by its slope, as it should: a small token
    budget's peak is mostly steady memory and says little of the transient per token (a median of
    per-trial ratios let one run's allocator jitter over a small slope set the scale). The offset takes
    the memory every run carries beyond the twin's (fragmentation), which is no transient per token."""
    served = [o for o in obs if o.outcome == Outcome.OK and o.peak_bytes][-MAX_MEMORY_TRIALS:]
    ooms = [o for o in obs if o.outcome in OOM_OUTCOMES][-MAX_MEMORY_TRIALS:]
    lines = []
    for o in served + ooms:
        one, two = box.predict(o.flags, _with(params, transient_scale=1.0)), \
            box.predict(o.flags, _with(params, transient_scale=2.0))
        p1, p2 = _peak(one), _peak(two)
        if p1 is None or p2 is None or p2 <= p1:
            continue
        lines.append((o, p1 - (p2 - p1), p2 - p1))
    prior_mean = np.array([params.transient_scale.value, 0.0])
    precision = np.diag([1 / TRANSIENT_PRIOR_SIGMA**2, 1 / PEAK_OFFSET_PRIOR_BYTES**2])
    fitted = [(o, i, sl) for o, i, sl in lines if o in served and o.peak_bytes is not None]
    if not lines:
        return params, PeakFit(0.0, np.linalg.inv(precision), PEAK_RUN_SIGMA_BYTES)
    design = np.array([[sl, 1.0] for _o, _i, sl in fitted]).reshape(-1, 2)
    target = np.array([float(o.peak_bytes or 0) - i for o, i, _sl in fitted])
    noise = PEAK_RUN_SIGMA_BYTES
    for _ in range(2):  # the run-to-run spread as the residuals show it, once there are enough of them
        lhs = design.T @ design / noise**2 + precision
        mean = np.linalg.solve(lhs, design.T @ target / noise**2 + precision @ prior_mean)
        if len(fitted) < 3:
            break
        noise = max(PEAK_RUN_SIGMA_BYTES, float(np.std(target - design @ mean)))
    cov = np.linalg.inv(lhs)
    value, offset = max(0.0, float(mean[0])), float(mean[1])
    floor = 0.0
    for o, intercept, slope in lines:
        if o in ooms and o.limit_fraction_total:
            # It went past the threshold or the card: the transient is at least what reaches the limit.
            limit = o.peak_bytes if o.peak_bytes else o.limit_fraction_total
            floor = max(floor, (min(limit, o.limit_fraction_total) - intercept - offset) / slope)
    value = max(value, floor)
    half = Z95 * math.sqrt(cov[0, 0])
    est = Estimate(value, max(floor, value - half), value + half)
    return _with_estimate(params, "transient_scale", est), PeakFit(offset, cov, noise)


def _residuals(box: TwinBox, served: Sequence[Observation], params: BoxParams) -> list[float]:
    out = []
    for o in served:
        predicted = box.predict(o.flags, params, o.workload)
        for name in METRIC_SIGMA:
            measured, guess = o.metrics.get(name), predicted.metrics.get(name)
            if measured and isinstance(guess, int | float) and guess > 0:
                out.append(math.log(measured / guess) / o.sigma_of(name))
            elif measured:
                out.append(0.0)  # the twin says it would not serve: no gradient from it
    return out


def _fit_perf(box: TwinBox, served: Sequence[Observation], params: BoxParams, prior: BoxParams,
              start: BoxParams | None) -> tuple[BoxParams, np.ndarray]:
    mean = np.array(prior.perf_vector(), dtype=float)
    sigma = np.array(_prior_sigma(prior), dtype=float)
    theta = np.array(start.perf_vector(), dtype=float) if start is not None else mean.copy()
    precision = np.diag(1 / sigma**2)
    jac = None
    for _ in range(ITERATIONS):
        base = with_perf(params, theta)
        r = np.array(_residuals(box, served, base))
        cols = []
        for i, step in enumerate(STEPS):
            moved = theta.copy()
            moved[i] += step
            cols.append((np.array(_residuals(box, served, with_perf(params, moved))) - r) / step)
        jac = np.stack(cols, axis=1)
        # Gauss-Newton on ‖r‖² + ‖θ − μ‖²_P with r(θ + δ) ≈ r + J δ.
        lhs = jac.T @ jac + precision
        rhs = -(jac.T @ r + precision @ (theta - mean))
        delta = np.linalg.solve(lhs + 1e-9 * np.eye(3), rhs)
        theta = theta + np.clip(delta, -MAX_STEP, MAX_STEP)
        if np.all(np.abs(delta) < np.array([0.005, 0.005, 5e-5])):
            break
    cov = np.linalg.inv((jac.T @ jac if jac is not None else 0) + precision)
    half = Z95 * np.sqrt(np.diag(cov))
    ce, be, ovh = theta
    return replace(with_perf(params, theta),
                   compute_efficiency=Estimate(math.exp(ce), math.exp(ce - half[0]), math.exp(ce + half[0])),
                   bandwidth_efficiency=Estimate(math.exp(be), math.exp(be - half[1]), math.exp(be + half[1])),
                   step_overhead_s=Estimate(max(0.0, ovh), max(0.0, ovh - half[2]), max(0.0, ovh + half[2]))), cov


def _prior_sigma(prior: BoxParams) -> tuple[float, float, float]:
    """The prior's σ per performance parameter: the defaults, or a warm start's intervals."""
    if prior is PRIOR:
        return PRIOR_SIGMA
    ce, be, ovh = prior.compute_efficiency, prior.bandwidth_efficiency, prior.step_overhead_s
    return (max(0.02, math.log(ce.high / ce.low) / (2 * Z95)), max(0.02, math.log(be.high / be.low) / (2 * Z95)),
            max(1e-4, (ovh.high - ovh.low) / (2 * Z95)))


def with_perf(params: BoxParams, theta: np.ndarray) -> BoxParams:
    ce, be, ovh = (float(x) for x in theta)
    return _with(params, compute_efficiency=math.exp(ce), bandwidth_efficiency=math.exp(be),
                 step_overhead_s=max(0.0, ovh))


def _with(params: BoxParams, **values: float) -> BoxParams:
    """`params` with point values replaced (intervals kept)."""
    changes = {}
    for name, value in values.items():
        old: Estimate = getattr(params, name)
        changes[name] = replace(old, value=value)
    return replace(params, **changes)


def _with_estimate(params: BoxParams, name: str, est: Estimate) -> BoxParams:
    return replace(params, **{name: est})
