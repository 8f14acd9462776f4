"""A scenario length distribution from production's `/metrics` histogram of request lengths.

vLLM buckets lengths at 1, 2, 5, 10, 20, 50, ... (`build_1_2_5_buckets`): too coarse to replay as an
empirical distribution (a 5000-10000 bucket would be drawn flat), so we fit a lognormal — the usual
shape of prompt and output lengths — by maximum likelihood on the bucket counts (interval-censored
data), clamped to the lowest and highest bucket that saw any request. A histogram whose requests all
fall in one bucket cannot tell a spread: it becomes a fixed length, the exact mean from `_sum`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from autotuner.scenario import LengthSettings
from autotuner.watch.snapshot import LengthHistogram


@dataclass(frozen=True)
class LengthFit:
    settings: LengthSettings
    requests: int
    mean: float  # observed, from _sum / _count
    quantiles: dict[float, float]  # observed, interpolated inside buckets (p50, p90, p99)
    note: str  # how it was derived, for the user


def _cdf(x: float, log_length: NormalDist) -> float:
    """P(length <= x) for a lognormal length whose log is distributed as `log_length`."""
    if x <= 0:
        return 0.0
    if math.isinf(x):
        return 1.0
    return log_length.cdf(math.log(x))


def _bins(hist: LengthHistogram) -> list[tuple[float, float, float]]:
    """(lower, upper, count) per bucket with requests in it. vLLM counts lengths as integers and a
    bucket `le` holds values ≤ le, so bucket (a, b] holds the integers a+1..b: its continuous interval
    is (a + 0.5, b + 0.5]."""
    out: list[tuple[float, float, float]] = []
    lower, below = 0.0, 0.0
    for le, cumulative in hist.buckets:
        n = cumulative - below
        if n > 0:
            out.append((lower + 0.5 if lower > 0 else 0.0, le + 0.5, n))
        lower, below = le, cumulative
    return out


def _nll(bins: list[tuple[float, float, float]], mu: float, sigma: float) -> float:
    total = 0.0
    log_length = NormalDist(mu, sigma)
    for lo, hi, n in bins:
        p = _cdf(hi, log_length) - _cdf(lo, log_length)
        total -= n * math.log(max(p, 1e-300))
    return total


def fit_lognormal(hist: LengthHistogram) -> tuple[float, float]:
    """(median, sigma) maximising the likelihood of the bucket counts: a grid, refined three times."""
    bins = _bins(hist)
    mean = hist.sum / hist.count
    mu0 = math.log(max(mean, 1.0))
    best = (mu0, 0.5)
    mu_span, sigma_lo, sigma_hi = 3.0, 0.01, 3.0
    for _ in range(4):
        mu_c, _ = best
        candidates = [(mu_c - mu_span + 2 * mu_span * i / 40, sigma_lo + (sigma_hi - sigma_lo) * j / 40)
                      for i in range(41) for j in range(41)]
        best = min(candidates, key=lambda c: _nll(bins, c[0], c[1]))
        mu_span /= 8
        s_span = (sigma_hi - sigma_lo) / 8
        sigma_lo, sigma_hi = max(0.005, best[1] - s_span), best[1] + s_span
    return math.exp(best[0]), best[1]


def length_from_histogram(hist: LengthHistogram, max_len: int | None = None) -> LengthFit | None:
    """None when the histogram saw no request."""
    if hist.count <= 0:
        return None
    mean = hist.sum / hist.count
    quantiles = {q: v for q in (0.5, 0.9, 0.99) if (v := hist.quantile(q)) is not None}
    bins = _bins(hist)
    finite_top = max((le for le, _ in hist.buckets if not math.isinf(le)), default=None)
    low_bound = max(1, math.ceil(bins[0][0])) if bins[0][0] > 0 else 1
    high_bound = bins[-1][1] - 0.5
    if math.isinf(high_bound):  # requests above the top bucket: only the context bounds them
        high_bound = float(max_len or finite_top or mean)
    top = int(high_bound) if max_len is None else min(int(high_bound), max_len)
    n = int(hist.count)
    if len(bins) == 1:
        value = max(1, min(round(mean), top))
        settings = LengthSettings(kind="fixed", value=value)
        note = f"all {n} requests fell in one bucket: fixed at their mean length {value}"
        return LengthFit(settings, n, mean, quantiles, note)
    median, sigma = fit_lognormal(hist)
    settings = LengthSettings(kind="lognormal", median=round(median, 1), sigma=round(sigma, 4),
                              min=max(1, min(low_bound, top)), max=max(1, top))
    note = (f"lognormal fitted by maximum likelihood to the {len(bins)} buckets of {n} requests "
            f"(median {median:.0f}, sigma {sigma:.3f}), clamped to {settings.min}-{settings.max}")
    return LengthFit(settings, n, mean, quantiles, note)
