"""Has production's prompt-length distribution moved away from the scenario's?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from autotuner.scenario import LengthSettings, Scenario
from autotuner.watch.snapshot import LengthHistogram

MIN_REQUESTS = 200


@dataclass(frozen=True)
class Drift:
    p95_scenario: float
    p95_production: float
    ratio: float  # production / scenario
    requests: int


def context_of(scenario: Scenario) -> int | None:
    """The scenario's max-model-len flag, when it sets one (else the model's own, which we cannot know here)."""
    value = scenario.engine.flags.get("max-model-len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def length_quantile(settings: LengthSettings, q: float) -> float:
    """The q-quantile of a scenario length distribution (after its min/max clamp)."""
    z = NormalDist().inv_cdf(min(max(q, 1e-9), 1 - 1e-9))
    if settings.kind == "fixed":
        raw = float(settings.value or 1)
    elif settings.kind == "uniform":
        low, high = float(settings.low or 1), float(settings.high or 1)
        raw = low + q * (high - low)
    elif settings.kind == "normal":
        raw = float(settings.mean or 1) + z * float(settings.stddev or 0)
    else:
        raw = float(settings.median or 1) * math.exp(z * float(settings.sigma or 0))
    raw = max(raw, float(settings.min), 1.0)
    return raw if settings.max is None else min(raw, float(settings.max))


def length_cdf(settings: LengthSettings, x: float) -> float:
    """P(length ≤ x) of a scenario length distribution (after its min/max clamp)."""
    if x < settings.min:
        return 0.0
    if settings.max is not None and x >= settings.max:
        return 1.0
    if settings.kind == "fixed":
        return 1.0 if x >= float(settings.value or 1) else 0.0
    if settings.kind == "uniform":
        low, high = float(settings.low or 1), float(settings.high or 1)
        return 1.0 if x >= high else 0.0 if x < low or high == low else (x - low) / (high - low)
    if settings.kind == "normal":
        sd = float(settings.stddev or 0)
        mean = float(settings.mean or 1)
        return (1.0 if x >= mean else 0.0) if sd == 0 else NormalDist(mean, sd).cdf(x)
    sigma, median = float(settings.sigma or 0), float(settings.median or 1)
    if x <= 0:
        return 0.0
    return (1.0 if x >= median else 0.0) if sigma == 0 else NormalDist().cdf(math.log(x / median) / sigma)


def bucketed_quantile(settings: LengthSettings, like: LengthHistogram, q: float, upper: int | None) -> float:
    """The q-quantile the scenario's distribution would read as through `like`'s buckets: production's p95
    is interpolated inside a bucket (500-1000 tokens wide up there), so the scenario's must be too, or a
    workload that has not moved reads as drift."""
    n = 1_000_000.0
    buckets = tuple((le, n if math.isinf(le) else n * length_cdf(settings, le)) for le, _ in like.buckets)
    value = LengthHistogram(buckets, n, 0.0).quantile(q, upper=upper)
    return value if value is not None else length_quantile(settings, q)


def _bucket(hist: LengthHistogram, value: float) -> int:
    """The index of the bucket `value` falls in."""
    return next((i for i, (le, _) in enumerate(hist.buckets) if value <= le), len(hist.buckets))


def prompt_drift(scenario: Scenario, window: LengthHistogram, *, min_requests: int = MIN_REQUESTS,
                 max_model_len: int | None = None) -> Drift | None:
    """p95 prompt length in production's window against the scenario's. None when the window holds fewer
    than `min_requests` requests or the scenario replays a trace (its lengths are not a distribution).

    `max_model_len` (the served context, else the scenario's max-model-len) bounds the +Inf bucket: without
    it every prompt above vLLM's last finite bucket reads as that bound and a p95 beyond it never shows."""
    requests = scenario.workload.requests
    if requests.kind != "synthetic" or window.count < max(1, min_requests):
        return None
    upper = max_model_len or context_of(scenario)
    production = window.quantile(0.95, upper=upper)
    if production is None:
        return None
    expected = length_quantile(requests.prompt_tokens, 0.95)
    if _bucket(window, production) <= _bucket(window, expected):
        # Both p95s in one bucket: the histogram cannot tell them apart, and interpolating production's
        # inside a 500-1000-token bucket against the scenario's exact value reads drift where there is none.
        # Compare like with like: the scenario's p95 as the same buckets would read it.
        expected = bucketed_quantile(requests.prompt_tokens, window, 0.95, upper)
    return Drift(p95_scenario=expected, p95_production=production, ratio=production / expected,
                 requests=int(window.count))
