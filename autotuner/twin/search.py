"""Searching the twin: the whole space on a coarse grid, then finer around the best, every point
predicted by the calibrated twin in virtual time.

A candidate is feasible when the twin says it serves within the SLOs and its predicted memory peak
(plus the offset every run of this box carries) stays under the OOM threshold by `PEAK_MARGIN_SIGMAS`
standard deviations of that prediction (the fitted scale's and offset's uncertainty where this candidate's
transient puts it, plus one run's spread): a wrong memory guess costs an OOM engine run, a cautious one a
few percent of throughput. Where nothing is feasible at that margin, the best SLO-feasible candidate
under the limit at one deviation is measured: it says where the wall is. Ranked by the
scenario's first objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import optuna

from autotuner.scenario import Scenario
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import constraints_of, feasible, threshold_of
from autotuner.twin.box import TwinBox
from autotuner.twin.calibrate import STEPS, Calibration, with_perf
from autotuner.vllm.flags import UTILIZATION


class SearchSpace(Protocol):
    """The tuner's search space as the twin uses it (tuner.space.Space)."""

    distributions: dict[str, optuna.distributions.BaseDistribution]

    def to_flags(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def clamp(self, flags: Mapping[str, Any]) -> dict[str, Any]: ...


# One-sided 95 %, the level of EXPLORE_Z: the margin only steers which runs the engine makes; what is
# exported stands on confirmation's peak bound and the soak. At 2.0 (97.7 %) the 4090-offload box of
# benchmarks/twin_first.py kept 0.5 GiB more offload than it needed (pick 0.928 of the oracle, 0.948 at
# 1.64) with no OOM run more on any box.
PEAK_MARGIN_SIGMAS = 1.64
# Before saying nothing better is left: how far an unmeasured candidate could plausibly beat the best
# measured one under the calibration's uncertainty (one-sided 95 %, in the twin's own frame).
EXPLORE_Z = 1.64
COARSE_POINTS = {"int-log": 8, "int": 6, "float": 6}
MAX_COARSE = 96
REFINE_TOP = 3


@dataclass(frozen=True)
class Candidate:
    params: dict[str, Any]  # Optuna params of the space
    flags: dict[str, Any]
    result: TrialResult
    value: float | None  # the first objective, predicted (None: does not serve)
    feasible: bool
    margin_bytes: float  # predicted room under the OOM limit, after the uncertainty margin
    violation: float = 0.0  # how far from feasible (the largest constraint; 1 past the memory margin)
    sigma_bytes: float = 0.0  # the predicted peak's standard deviation
    slo_met: bool = False  # within every SLO (whatever the memory margin says)

    @property
    def key(self) -> str:
        return key_of(self.params)


def key_of(params: Mapping[str, Any]) -> str:
    """The same point whichever way it was written (Optuna's stored floats, the grid's)."""
    def text(v: Any) -> str:
        return f"{float(v):.6g}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)

    return "|".join(f"{k}={text(params[k])}" for k in sorted(params))


def _values(dist: optuna.distributions.BaseDistribution, n: int) -> list[Any]:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    lo, hi = float(dist.low), float(dist.high)  # type: ignore[attr-defined]
    if hi <= lo:
        return [dist.low]  # type: ignore[attr-defined]
    log = bool(getattr(dist, "log", False))
    raw = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1)) if log else lo + (hi - lo) * i / (n - 1)
           for i in range(n)]
    return sorted({_snap(dist, v) for v in raw})


def _snap(dist: optuna.distributions.BaseDistribution, value: float) -> Any:
    """`value` on the distribution's grid and in its range."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return value
    lo, hi = dist.low, dist.high  # type: ignore[attr-defined]
    step = getattr(dist, "step", None)
    value = min(hi, max(lo, value))
    if step:
        value = lo + round((value - lo) / step) * step
        value = min(hi, max(lo, value))
    if isinstance(dist, optuna.distributions.IntDistribution):
        return round(value)
    return round(float(value), 6)


def coarse_grid(space: SearchSpace) -> list[dict[str, Any]]:
    kinds = {}
    for name, dist in space.distributions.items():
        if isinstance(dist, optuna.distributions.IntDistribution):
            kinds[name] = "int-log" if dist.log else "int"
        else:
            kinds[name] = "float"
    counts = {name: COARSE_POINTS.get(kind, 6) for name, kind in kinds.items()}
    while True:
        axes = {name: _values(dist, counts[name]) for name, dist in space.distributions.items()}
        size = math.prod(len(v) for v in axes.values())
        shrinkable = [n for n in counts if counts[n] > 3 and len(axes[n]) > 3]
        if size <= MAX_COARSE or not shrinkable:
            break
        counts[max(shrinkable, key=lambda n: counts[n])] -= 1
    grid: list[dict[str, Any]] = [{}]
    for name, values in axes.items():
        grid = [{**g, name: v} for g in grid for v in values]
    return grid


def neighbours(space: SearchSpace, params: Mapping[str, Any], fraction: float) -> list[dict[str, Any]]:
    """One step either way along each axis: `fraction` of the axis (in log for log axes)."""
    out = []
    for name, dist in space.distributions.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution) or name not in params:
            continue
        lo, hi, v = float(dist.low), float(dist.high), float(params[name])  # type: ignore[attr-defined]
        if hi <= lo:
            continue
        for sign in (-1, 1):
            if getattr(dist, "log", False) and v > 0:
                moved = math.exp(math.log(v) + sign * fraction * (math.log(hi) - math.log(lo)))
            else:
                moved = v + sign * max(fraction * (hi - lo), float(getattr(dist, "step", 0) or 0))
            snapped = _snap(dist, moved)
            if snapped != params[name]:
                out.append({**params, name: snapped})
    return out


class TwinSearch:
    """Predictions of one calibration, memoised (a search asks the same point from several centres)."""

    def __init__(self, box: TwinBox, scenario: Scenario, space: SearchSpace, calibration: Calibration) -> None:
        self.box = box
        self.scenario = scenario
        self.space = space
        self.calibration = calibration
        self.objective = scenario.objectives[0]
        self.threshold = threshold_of(scenario)
        self._seen: dict[str, Candidate] = {}

    def predict(self, params: Mapping[str, Any]) -> Candidate:
        key = key_of(params)
        if key not in self._seen:
            flags = self.space.to_flags(params)
            result = self.box.predict(flags, self.calibration.params)
            self._seen[key] = self._judge(dict(params), flags, result)
        return self._seen[key]

    def _judge(self, params: dict[str, Any], flags: dict[str, Any], result: TrialResult) -> Candidate:
        bias = self.calibration.bias
        if bias and result.metrics:
            result = replace(result, metrics={k: v * bias.get(k, 1.0) if isinstance(v, int | float) else v
                                              for k, v in result.metrics.items()})
        value = result.metrics.get(self.objective.metric)
        constraints = constraints_of(result, self.scenario)
        ok = slo_met = feasible(constraints) and isinstance(value, int | float)
        violation = max(0.0, *constraints.values())
        margin, sigma = math.inf, 0.0
        peaks, totals = result.memory.get("peak_bytes"), result.memory.get("total_bytes")
        if isinstance(peaks, list) and peaks and isinstance(totals, list) and totals:
            total = int(max(totals))
            fit = self.calibration.peak
            peak = float(max(peaks)) + fit.offset_bytes
            scale = max(1e-9, self.calibration.params.transient_scale.value)
            # Bytes the peak moves per unit of the transient scale: the transient share of this peak.
            steady = result.memory.get("steady_bytes")
            transient = max(0.0, float(max(peaks)) - float(steady)) if isinstance(steady, int | float) else 0.1 * peak
            sigma = fit.sigma_bytes(transient / scale)
            margin = self.threshold.limit_bytes(total) - peak - PEAK_MARGIN_SIGMAS * sigma
            ok = ok and margin >= 0
        if margin < 0:
            violation = max(violation, 1.0)
        return Candidate(params, flags, result, float(value) if isinstance(value, int | float) else None, ok, margin,
                         violation, sigma, slo_met)

    def better(self, a: Candidate, b: Candidate) -> bool:
        if a.value is None or b.value is None:
            return a.value is not None
        return a.value > b.value if self.objective.direction == "maximize" else a.value < b.value

    def ranked(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        return self.ranked_any(c for c in candidates if c.feasible)

    def nearest_feasible(self, exclude: set[str]) -> Candidate | None:
        """When the twin predicts nothing feasible: the best candidate within the SLOs whose peak stays
        under the limit at one standard deviation (the full margin was too cautious to call it feasible:
        SLOs that need the KV cache of a high utilisation put the front at the memory wall); else the
        serving candidate that misses its SLO by least (within the memory margin), best by the objective
        among near ties. Measuring it tells the twin where the edge really is."""
        edge = [c for c in self._seen.values() if c.key not in exclude and c.slo_met
                and c.margin_bytes + (PEAK_MARGIN_SIGMAS - 1) * c.sigma_bytes >= 0]
        if edge:
            return self.ranked_any(edge)[0]
        pool = [c for c in self._seen.values() if c.key not in exclude and c.value is not None
                and c.margin_bytes >= 0 and c.violation < 1.0]
        if not pool:
            return None
        least = min(c.violation for c in pool)
        near = [c for c in pool if c.violation <= least + 0.02]
        return self.ranked_any(near)[0]

    def contenders(self, exclude: set[str]) -> list[Candidate]:
        """Unmeasured feasible candidates worth asking "could it be better?": the best few, and the best
        at each value of each axis, so that the far end of an axis no measurement reached is asked too."""
        pool = [c for c in self.ranked(self._seen.values()) if c.key not in exclude]
        out = {c.key: c for c in pool[:REFINE_TOP]}
        for name in self.space.distributions:
            best_at: dict[str, Candidate] = {}
            for c in pool:  # best first: the first seen at a value is its best
                best_at.setdefault(key_of({name: c.params.get(name)}), c)
            for c in best_at.values():
                out.setdefault(c.key, c)
        return list(out.values())

    def optimistic_gain(self, c: Candidate, best: Candidate) -> float | None:
        """How much better than `best` `c` could be (log ratio, > 0: better), its predicted gain plus
        EXPLORE_Z standard deviations of that gain under the calibrated parameters' covariance: the
        candidates differ in how they load compute, bandwidth and the per-step overhead, so a parameter
        the measurements left loose moves one more than the other."""
        gc, gb = self._gradient(c), self._gradient(best)
        if gc is None or gb is None or c.value is None or best.value is None or c.value <= 0 or best.value <= 0:
            return None
        sign = 1.0 if self.objective.direction == "maximize" else -1.0
        gain = sign * (math.log(c.value) - math.log(best.value))
        d = gc - gb
        sd = float(math.sqrt(max(0.0, float(d @ self.calibration.perf_covariance() @ d))))
        return gain + EXPLORE_Z * sd

    def _gradient(self, c: Candidate) -> np.ndarray | None:
        params = self.calibration.params
        theta = np.array(params.perf_vector(), dtype=float)
        base = self._log_value(c.flags, params)
        if base is None:
            return None
        out = []
        for i, step in enumerate(STEPS):
            moved = theta.copy()
            moved[i] += step
            value = self._log_value(c.flags, with_perf(params, moved))
            if value is None:
                return None
            out.append((value - base) / step)
        return np.array(out)

    def _log_value(self, flags: Mapping[str, Any], params: Any) -> float | None:
        value = self.box.predict(flags, params).metrics.get(self.objective.metric)
        return math.log(value) if isinstance(value, int | float) and value > 0 else None

    def ranked_any(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        sign = -1.0 if self.objective.direction == "maximize" else 1.0
        return sorted((c for c in candidates if c.value is not None), key=lambda c: sign * (c.value or 0.0))

    def run(self, extra: Iterable[Mapping[str, Any]] = ()) -> list[Candidate]:
        """Coarse grid (plus `extra` points: those measured), its memory wall along the utilization, then
        two rounds of refinement around the best; the feasible candidates, best first."""
        grid = coarse_grid(self.space)
        for params in [*grid, *extra]:
            self.predict(params)
        for params in self.walls(grid):
            self.predict(params)
        for fraction, top in ((1 / 14, REFINE_TOP), (1 / 28, 1)):
            for c in self._centres(top):
                for params in neighbours(self.space, c.params, fraction):
                    self.predict(params)
        return self.ranked(self._seen.values())

    def walls(self, grid: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """For each point of the grid's other axes, the highest utilization predicted to fit (room under
        the OOM limit after the uncertainty margin). The front of a KV-hungry workload lies there, where a
        latency SLO wants the KV cache and the wall stops it, and the coarse grid steps over it: on a
        three-axis space it has four utilizations from 0.7 to 0.95, and the band that serves within the
        SLOs can be 0.91–0.93. The room falls with the utilization (it is the KV cache's), so the wall is
        found by bisection on the axis's own steps."""
        dist = self.space.distributions.get(UTILIZATION)
        if not isinstance(dist, optuna.distributions.FloatDistribution) or dist.high <= dist.low:
            return []
        step = dist.step or (dist.high - dist.low) / 50
        values = sorted({_snap(dist, dist.low + i * step) for i in range(round((dist.high - dist.low) / step) + 1)})
        rests = {key_of({k: v for k, v in g.items() if k != UTILIZATION}): dict(g) for g in grid}
        out = []
        for point in rests.values():
            def fits(i: int, point: Mapping[str, Any] = point) -> bool:
                return self.predict({**point, UTILIZATION: values[i]}).margin_bytes >= 0

            lo, hi = 0, len(values) - 1
            if not fits(lo):
                continue
            if fits(hi):
                lo = hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            out.append({**point, UTILIZATION: values[lo]})
        return out

    def _centres(self, top: int) -> list[Candidate]:
        """Where to refine: the best feasible; short of `top` of them, the serving candidates nearest to
        feasible too (a narrow feasible band, e.g. between an SLO that wants KV cache and the memory wall,
        can fall between the coarse grid's points)."""
        out = self.ranked(self._seen.values())[:top]
        if len(out) < top:
            near = sorted((c for c in self._seen.values() if c.value is not None and not c.feasible),
                          key=lambda c: (round(c.violation, 2), -(c.value or 0.0)
                                         if self.objective.direction == "maximize" else c.value or 0.0))
            out += near[:top - len(out)]
        return out
