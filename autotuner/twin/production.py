"""Production's own /metrics as the twin's evidence: calibration with no downtime.

While production serves, the daemon's watcher keeps a window of what it served (watch/served.py): the
request rate, the prompt and output lengths, the TTFT and inter-token latency its requests saw. With the
flags production runs, that is one more measured trial of this box, on a workload of its own: the twin
predicts the served config under Poisson arrivals at the observed rate, prompts around their exact mean,
outputs at their mean, and is fitted to the observed TTFT p50 and inter-token latency p50
(against its TPOT p50: one token's gap, the same step time).

The histograms are coarse (TTFT buckets 0.1, 0.25, 0.5 s …): a p50 read from one is known to within its
bucket, so each metric's weight in the fit is its run-to-run spread combined with the bucket's width
(a uniform error across the bucket), and a wide bucket weighs little.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from autotuner.scenario import Scenario
from autotuner.trials.outcomes import Outcome
from autotuner.twin.calibrate import METRIC_SIGMA, Observation


class Histogram(Protocol):
    """A Prometheus histogram of the window (watch/snapshot.py's LengthHistogram)."""

    @property
    def mean(self) -> float | None: ...
    def quantile(self, q: float, upper: float | None = None) -> float | None: ...
    def bucket_width_at(self, value: float) -> float: ...


class ServedWindow(Protocol):
    """What production served over a window (watch/served.py's ServedWindow, read by the daemon's
    watcher; the twin sits below it and asks only for this)."""

    model: str | None
    max_model_len: int | None

    @property
    def prompt_tokens(self) -> Histogram: ...
    @property
    def generation_tokens(self) -> Histogram: ...
    @property
    def ttft_s(self) -> Histogram: ...
    @property
    def itl_s(self) -> Histogram: ...
    @property
    def request_rate(self) -> float: ...


PRODUCTION = "production"  # an observation's kind: production's served window, no trial
# Requests the twin replays for production's workload: its p50s then hardly depend on the draw of the
# Poisson arrivals (each prediction is a virtual-time run of this many).
REQUESTS = 200


def _p50_and_sigma(hist: Histogram, base: float) -> tuple[float, float] | None:
    value = hist.quantile(0.5)
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    width = hist.bucket_width_at(value)
    if not math.isfinite(width):
        return None  # in the +Inf bucket: the histogram does not say where
    return value, math.hypot(base, width / math.sqrt(12) / value)


def served_workload(scenario: Scenario, window: ServedWindow) -> dict[str, Any]:
    """The study's workload settings replaced by what production served (a JSON dict for the scenario):
    Poisson arrivals at the observed rate; prompts uniform around their exact mean (the histogram's sum),
    as wide as its 10th percentile says (its 1-2-5 buckets place a quantile only roughly, the mean
    exactly); outputs at their mean."""
    prompts = window.prompt_tokens
    upper = window.max_model_len
    out_mean = window.generation_tokens.mean or 1.0
    mean = prompts.mean or 1.0
    cap = max(1.0, upper - out_mean - 1) if upper is not None else math.inf
    mean = min(mean, cap)
    low = max(1.0, min(prompts.quantile(0.1, upper=upper) or mean, mean))
    high = 2 * mean - low
    if high > cap:
        high, low = cap, max(1.0, 2 * mean - cap)
    base = scenario.workload.model_dump(mode="json")
    base["requests"].update(kind="synthetic", count=REQUESTS, path=None, include_prompt_tokens=[],
                            prompt_tokens={"kind": "uniform", "low": round(low), "high": max(round(low), round(high))},
                            output_tokens={"kind": "fixed", "value": max(1, round(out_mean))})
    base["arrivals"] = {"kind": "poisson", "rate": window.request_rate}
    base.update(max_requests=None, max_duration_s=None, ignore_eos=True, warmup_requests=0)
    return base


def production_observation(scenario: Scenario, window: ServedWindow, flags: Mapping[str, object],
                           number: int = -1) -> Observation | None:
    """The served window as the twin's observation of `flags` (production's config, the study's flags
    merged in), or None where it says nothing the twin can use (another model, no latency to read)."""
    if window.model is not None and window.model != scenario.engine.model:
        return None
    # Not the throughput: below saturation it is the arrival rate's, and the twin's own Poisson draw moves
    # its prediction by more than the box does.
    metrics: dict[str, float] = {}
    sigma: dict[str, float] = {}
    for name, hist in (("ttft_p50_s", window.ttft_s), ("tpot_p50_s", window.itl_s)):
        read = _p50_and_sigma(hist, METRIC_SIGMA[name])
        if read is not None:
            metrics[name], sigma[name] = read
    if not metrics:
        return None
    return Observation(number, PRODUCTION, dict(flags), Outcome.OK, metrics, None, None, None,
                       workload=served_workload(scenario, window), sigma=sigma)


# The study's user attribute that holds the production observations it was started with: the twin's
# calibration reads them from the study, so a resumed study and `autotuner twin` see what the search saw.
STUDY_ATTR = "twin_production"


def stored(user_attrs: Mapping[str, Any]) -> list[Observation]:
    raw = user_attrs.get(STUDY_ATTR) or []
    return [Observation.from_dict(o) for o in raw if isinstance(o, dict)]
