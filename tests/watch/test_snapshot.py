"""LengthHistogram arithmetic, OOM lines and drift against hand-computed values."""

from __future__ import annotations

import math

import pytest

from autotuner.scenario import Scenario
from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch import LengthHistogram, oom_lines, prompt_drift
from autotuner.watch.drift import length_quantile


def hist(counts: dict[float, float], total: float = 0.0) -> LengthHistogram:
    """Per-bucket counts → cumulative histogram with +Inf."""
    running, buckets = 0.0, []
    for le in sorted(counts):
        running += counts[le]
        buckets.append((le, running))
    if not math.isinf(buckets[-1][0]):
        buckets.append((math.inf, running))
    return LengthHistogram(tuple(buckets), running, total)


def test_vllm_bucket_rule() -> None:
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(8192)[-3:] == (1000, 2000, 5000)


def test_quantile_interpolates_inside_the_bucket() -> None:
    h = hist({100: 0, 200: 10, 500: 10})  # 10 in (100, 200], 10 in (200, 500]
    assert h.quantile(0.5) == pytest.approx(200)
    assert h.quantile(0.25) == pytest.approx(150)
    assert h.quantile(0.75) == pytest.approx(350)
    assert h.quantile(1.0) == pytest.approx(500)
    assert LengthHistogram(((math.inf, 0.0),), 0, 0).quantile(0.5) is None
    with pytest.raises(ValueError):
        h.quantile(1.5)


def test_quantile_in_the_inf_bucket_is_the_top_finite_bound() -> None:
    h = hist({10: 1, math.inf: 9})
    assert h.quantile(0.9) == 10


def test_since_subtracts_and_survives_a_restart() -> None:
    earlier = hist({10: 5, 100: 5}, total=300)
    later = hist({10: 7, 100: 13}, total=1000)
    window = later.since(earlier)
    assert window.count == 10
    assert window.sum == 700
    assert dict(window.buckets)[10] == 2
    assert dict(window.buckets)[100] == 10
    restarted = hist({10: 1, 100: 1}, total=20)
    assert restarted.since(earlier) == restarted  # counters went down: the engine restarted


def test_oom_lines_picks_only_the_cuda_oom() -> None:
    text = "\n".join([
        "(APIServer pid=1) INFO 11-30 08:30:01 [api_server.py:1885] Started server process",
        "(EngineCore pid=2) ERROR 11-30 08:31:02 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 23.69 GiB of which 10.00 MiB is free.",
        "(APIServer pid=1) ERROR 11-30 08:31:02 [async_llm.py:480] EngineDeadError: EngineCore encountered an issue.",
    ])
    lines = oom_lines(text)
    assert len(lines) == 1
    assert "Tried to allocate 512.00 MiB" in lines[0]
    assert oom_lines("all fine\n") == []


def scenario(prompt: dict[str, object]) -> Scenario:
    return Scenario.model_validate({"engine": {"model": "llama-2-13b"},
                                    "workload": {"requests": {"prompt_tokens": prompt}}})


def test_length_quantile_of_each_kind() -> None:
    assert length_quantile(scenario({"kind": "fixed", "value": 700}).workload.requests.prompt_tokens, 0.95) == 700
    uniform = scenario({"kind": "uniform", "low": 1000, "high": 3000}).workload.requests.prompt_tokens
    assert length_quantile(uniform, 0.95) == pytest.approx(2900)
    lognormal = scenario({"kind": "lognormal", "median": 1000, "sigma": 0.5}).workload.requests.prompt_tokens
    assert length_quantile(lognormal, 0.95) == pytest.approx(1000 * math.exp(1.6448536 * 0.5), rel=1e-6)


def test_prompt_drift_needs_enough_requests() -> None:
    s = scenario({"kind": "uniform", "low": 1000, "high": 3000})
    longer = hist({2000: 0, 5000: 300})  # p95 = 2000 + 3000 × 0.95 = 4850
    drift = prompt_drift(s, longer)
    assert drift is not None
    assert drift.p95_production == pytest.approx(4850)
    # The scenario's exact p95 (2900) is in the same 2000-5000 bucket: it is read through that bucket too
    # (half its prompts below 2000: 2000 + 3000 × 0.45 / 0.5 = 4700), like with like.
    assert drift.p95_scenario == pytest.approx(4700)
    assert drift.ratio == pytest.approx(4850 / 4700)
    assert drift.requests == 300
    assert prompt_drift(s, hist({2000: 0, 5000: 50})) is None
    assert prompt_drift(s, hist({2000: 0, 5000: 50}), min_requests=10) is not None
