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


def prompt_drift(scenario: Scenario, window: LengthHistogram, *, min_requests: int = MIN_REQUESTS,
                 max_model_len: int | None = None) -> Drift | None:
    """p95 prompt length in production's window against the scenario's. None when the window holds fewer
    than `min_requests` requests or the scenario replays a trace (its lengths are not a distribution).

    `max_model_len` (the served context, else the scenario's max-model-len) bounds the +Inf bucket: without
    it every prompt above vLLM's last finite bucket reads as that bound and a p95 beyond it never shows."""
    requests = scenario.workload.requests
    if requests.kind != "synthetic" or window.count < max(1, min_requests):
        return None
    production = window.quantile(0.95, upper=max_model_len or context_of(scenario))
    if production is None:
        return None
    expected = length_quantile(requests.prompt_tokens, 0.95)
    return Drift(p95_scenario=expected, p95_production=production, ratio=production / expected,
                 requests=int(window.count))
