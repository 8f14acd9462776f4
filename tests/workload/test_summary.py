"""summarize(): the figures a trial is scored on, from hand-made results with known timings."""

from __future__ import annotations

import pytest

from autotuner.stats import percentile
from autotuner.workload.client import RequestResult
from autotuner.workload.summary import SUMMARY_KEYS, summarize


def done(sent: float, first: float, end: float, *, out: int, prompt: int = 100, queue: float = 0.0,
         itl: list[float] | None = None) -> RequestResult:
    return RequestResult(ok=True, status=200, scheduled_at=sent - queue, sent_at=sent, first_token_at=first,
                         finished_at=end, itl_s=itl or [], prompt_tokens=prompt, output_tokens=out)


def failed(sent: float | None, end: float, queue: float = 0.0) -> RequestResult:
    return RequestResult(ok=False, status=500 if sent is not None else None, error="HTTP 500: boom",
                         scheduled_at=(sent or end) - queue, sent_at=sent, finished_at=end)


RESULTS = [
    done(10.0, 10.5, 12.0, out=31, itl=[0.05] * 30),  # ttft 0.5, tpot 1.5/30 = 0.05
    done(10.2, 11.2, 13.2, out=21, queue=0.2, itl=[0.1] * 20),  # ttft 1.0, tpot 2.0/20 = 0.1
    done(11.0, 11.2, 14.0, out=11, prompt=50, itl=[0.3] * 10),  # ttft 0.2, tpot 2.8/10 = 0.28
    failed(11.5, 20.0, queue=0.4),  # a slow failure after the last completion does not stretch the span
]


def test_keys_are_exactly_the_contract() -> None:
    s = summarize(RESULTS)
    assert tuple(s) == SUMMARY_KEYS
    assert set(SUMMARY_KEYS) >= {"output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s",
                                 "ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s",
                                 "e2e_p95_s", "completed", "failed"}


def test_throughput_is_completed_tokens_over_first_send_to_last_completion() -> None:
    s = summarize(RESULTS, duration_s=99.0)  # the span wins over the caller's duration
    span = 14.0 - 10.0
    assert s["duration_s"] == pytest.approx(span)
    assert s["output_tokens"] == 63 and s["prompt_tokens"] == 250
    assert s["output_tokens_per_s"] == pytest.approx(63 / span)
    assert s["total_tokens_per_s"] == pytest.approx(313 / span)
    assert s["requests_per_s"] == pytest.approx(3 / span)
    assert s["completed"] == 3 and s["failed"] == 1


def test_latency_percentiles_use_the_project_percentile() -> None:
    s = summarize(RESULTS)
    ttfts = [0.5, 1.0, 0.2]
    assert s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["ttft_p90_s"] == pytest.approx(percentile(ttfts, 90))  # 0.9 between 0.5 and 1.0
    assert s["ttft_p90_s"] == pytest.approx(0.9)
    assert s["ttft_p99_s"] == pytest.approx(0.99)
    assert s["tpot_p50_s"] == pytest.approx(0.1)
    assert s["itl_p99_s"] == pytest.approx(0.3)
    assert s["e2e_p95_s"] == pytest.approx(percentile([2.0, 3.0, 3.0], 95))
    assert s["queue_p95_s"] == pytest.approx(percentile([0.0, 0.2, 0.0, 0.4], 95))  # failures queue too


def test_time_scale_multiplies_durations_and_divides_rates() -> None:
    base, fast = summarize(RESULTS), summarize(RESULTS, time_scale=100.0)
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s", "duration_s", "queue_p95_s"):
        assert fast[key] == pytest.approx(base[key] * 100), key  # type: ignore[operator]
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s"):
        assert fast[key] == pytest.approx(base[key] / 100), key  # type: ignore[operator]
    for key in ("completed", "failed", "prompt_tokens", "output_tokens"):
        assert fast[key] == base[key]


def test_nothing_completed() -> None:
    s = summarize([failed(1.0, 2.0), failed(None, 2.5)], duration_s=3.0, time_scale=2.0)
    assert s["completed"] == 0 and s["failed"] == 2
    assert s["output_tokens_per_s"] == 0.0 and s["requests_per_s"] == 0.0
    assert s["ttft_p50_s"] is None and s["e2e_p95_s"] is None
    assert s["duration_s"] == 6.0
    assert summarize([])["ttft_p99_s"] is None
