"""Length distributions fitted to vLLM's bucketed histograms, against histograms built by hand."""

from __future__ import annotations

import math
import random

import pytest

from autotuner.init.lengths import length_from_histogram
from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch import LengthHistogram
from autotuner.watch.drift import length_quantile


def histogram_of(values: list[int], max_len: int) -> LengthHistogram:
    bounds = [float(b) for b in build_1_2_5_buckets(max_len)] + [math.inf]
    buckets = tuple((le, float(sum(v <= le for v in values))) for le in bounds)
    return LengthHistogram(buckets, float(len(values)), float(sum(values)))


def test_lognormal_traffic_is_recovered() -> None:
    rng = random.Random(7)
    values = [round(rng.lognormvariate(math.log(800), 0.8)) for _ in range(5000)]
    fit = length_from_histogram(histogram_of(values, 32768))
    assert fit is not None and fit.settings.kind == "lognormal"
    assert fit.settings.median == pytest.approx(800, rel=0.05)
    assert fit.settings.sigma == pytest.approx(0.8, rel=0.05)
    assert fit.requests == 5000 and fit.mean == pytest.approx(sum(values) / 5000)


def test_one_bucket_is_a_fixed_length_at_the_mean() -> None:
    fit = length_from_histogram(histogram_of([300, 310, 320, 330], 8192))
    assert fit is not None
    assert fit.settings.kind == "fixed" and fit.settings.value == 315


def test_clamped_to_the_buckets_that_saw_requests_and_to_the_context() -> None:
    rng = random.Random(3)
    values = [rng.randint(1200, 4800) for _ in range(400)]  # buckets 1000-2000 and 2000-5000
    fit = length_from_histogram(histogram_of(values, 8192))
    assert fit is not None
    assert fit.settings.min == 1001 and fit.settings.max == 5000
    capped = length_from_histogram(histogram_of(values, 8192), max_len=4000)
    assert capped is not None and capped.settings.max == 4000
    # A uniform traffic is not lognormal: the fit is approximate, still inside what the buckets say.
    assert 2000 < length_quantile(fit.settings, 0.5) < 4000


def test_requests_above_the_top_bucket_are_bounded_by_the_context() -> None:
    fit = length_from_histogram(histogram_of([100, 200, 9000, 9500], 5000), max_len=12000)
    assert fit is not None and fit.settings.max == 12000
    assert length_from_histogram(LengthHistogram(((math.inf, 0.0),), 0.0, 0.0)) is None
