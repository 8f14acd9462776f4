"""Small statistics shared by every report: one percentile definition for the whole tool, and the
mean with its 95 % confidence interval of a few repeated measurements (Student's t). The base layer:
it imports nothing of ours, so every layer above may use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


# Two-sided 95 % quantiles of Student's t by degrees of freedom; beyond 30 the normal's 1.96 is close.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def describe(self, fmt: str = "{:.4g}") -> str:
        return f"{fmt.format(self.mean)} ± {fmt.format(self.half_width)} (95 % CI, n={self.n})"


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The standard deviation pooled over groups measured alike (each about its own mean) and its degrees
    of freedom; None when no group has two values."""
    squares, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            mean = statistics.fmean(g)
            squares += sum((v - mean) ** 2 for v in g)
            df += len(g) - 1
    return None if df == 0 else (math.sqrt(squares / df), df)


def next_high(values: list[float], pooled: tuple[float, int] | None = None) -> float | None:
    """The upper 97.5 % prediction bound of one more draw (mean + t·s·√(1 + 1/n)): what the next run may
    reach, which a bound on the mean (`interval`) does not say. None below two values unless `pooled`
    gives the spread.

    `pooled`: a standard deviation in the values' own units pooled over groups measured alike, with its
    degrees of freedom; where it has more than the values' own, s is the larger of the two at its t.
    Four lucky draws can agree to a tenth of a percent while the spread the others show puts every
    other start past the limit."""
    finite = [v for v in values if math.isfinite(v)]
    n = len(finite)
    if n == 0 or (n < 2 and pooled is None):
        return None
    own = statistics.stdev(finite) if n >= 2 else 0.0
    if pooled is not None and pooled[1] > n - 1:
        return statistics.fmean(finite) + t975(pooled[1]) * max(pooled[0], own) * math.sqrt(1 + 1 / n)
    return statistics.fmean(finite) + t975(n - 1) * own * math.sqrt(1 + 1 / n)


def interval(values: list[float], pooled: tuple[float, int] | None = None) -> Interval | None:
    """The mean with its 95 % interval; None without a value; one value gives a zero-width interval
    (nothing to say about spread) unless `pooled` does.

    `pooled`: a relative spread (the standard deviation of the logs) pooled over configurations measured
    alike, and its degrees of freedom (`pooled_sd` of their logs). Where it has more degrees of freedom
    than the values' own, the half-width stands on it: two runs alone give t = 12.7, an interval too wide
    to tell anything apart. The larger of the two spreads is taken, so that a configuration noisier than
    the rest does not borrow their steadiness; one value then gets an interval too."""
    return _around(values, pooled, lambda n: 1 / math.sqrt(n))


def next_run(values: list[float], pooled: tuple[float, int] | None = None) -> Interval | None:
    """Where one more run falls, 95 % (mean ± t·s·√(1 + 1/n)): what a single later measurement of the
    same configuration is to be held against, never the mean's interval. None without a spread."""
    out = _around(values, pooled, lambda n: math.sqrt(1 + 1 / n))
    return out if out is not None and (out.n > 1 or out.half_width > 0) else None


def _around(values: list[float], pooled: tuple[float, int] | None,
            factor: Callable[[int], float]) -> Interval | None:
    """mean ± t·s·factor(n), s and t from the values or from `pooled` (see `interval`)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    mean = statistics.fmean(finite)
    n = len(finite)
    own = _log_sd(finite) if n >= 2 else 0.0
    if pooled is not None and pooled[1] > n - 1 and own is not None and mean > 0:
        half = t975(pooled[1]) * max(pooled[0], own) * mean * factor(n)
    elif n == 1:
        half = 0.0
    else:
        half = t975(n - 1) * statistics.stdev(finite) * factor(n)
    return Interval(mean, mean - half, mean + half, n)


def _log_sd(values: list[float]) -> float | None:
    return statistics.stdev([math.log(v) for v in values]) if all(v > 0 for v in values) else None


def pooled_log_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """`pooled_sd` of the logs of groups of positive values (a group with a value ≤ 0 is left out): the
    relative spread shared by configurations measured alike."""
    return pooled_sd([[math.log(v) for v in g] for g in groups if g and all(v > 0 for v in g)])
