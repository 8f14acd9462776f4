"""Prometheus text parsing, on a literal snippet and on the simulator's real /metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from autotuner.engine.ports import free_port
from autotuner.workload.client import StreamingClient, http_client
from autotuner.workload.prometheus import (
    KV_CACHE_USAGE,
    MetricsParseError,
    ScrapeError,
    delta,
    parse,
    peak,
    poll,
    scrape,
)
from autotuner.workload.replay import replay
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec

SNIPPET = r"""
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25 1712345678000
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 1.0
odd_metric{path="/a,b",quote="say \"hi\"",} +Inf
no_labels 42
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.5
"""


def test_parse_a_literal_snippet() -> None:
    snap = parse(SNIPPET, t=1.0)
    assert snap.get("vllm:num_preemptions_total") == 3.0
    assert snap.get(KV_CACHE_USAGE) == 0.25  # the timestamp is not the value
    assert snap.get("vllm:request_success_total") == 10.0  # summed over label sets
    assert snap.get("vllm:request_success_total", finished_reason="stop") == 3.0
    assert snap.get("vllm:request_success_total", finished_reason="stop", engine="1") == 1.0
    assert snap.by_label("vllm:request_success_total", "finished_reason") == {"length": 7.0, "stop": 3.0}
    assert snap.get("odd_metric", path="/a,b", quote='say "hi"') == float("inf")
    assert snap.get("no_labels") == 42.0 and snap.get("absent") is None
    hist = snap.histogram("vllm:time_to_first_token_seconds")
    assert hist is not None and hist.count == 5.0 and hist.sum == 3.5
    assert hist.buckets == ((0.1, 1.0), (1.0, 4.0), (float("inf"), 5.0))


@pytest.mark.parametrize("bad", ["vllm:x{a=1} 2", "vllm:x{a=\"1\"}", "{a=\"1\"} 2", "vllm:x 1 2 3"])
def test_malformed_lines_are_errors_with_the_line(bad: str) -> None:
    with pytest.raises(MetricsParseError, match="line 2"):
        parse("ok 1\n" + bad)


def test_delta_counts_increases_and_reads_gauges_after() -> None:
    before = parse(SNIPPET, t=1.0)
    after = parse(SNIPPET.replace("} 3.0", "} 5.0").replace("} 7.0", "} 9.0").replace("0.25 17", "0.5 17")
                  + 'vllm:generation_tokens_total{model_name="m"} 80\n', t=3.5)
    d = delta(before, after)
    assert d.seconds == 2.5 and d.preemptions == 2.0 and d.generation_tokens == 80.0
    assert d.request_success == {"length": 2.0, "stop": 0.0}
    assert d.kv_cache_usage_perc == 0.5 and d.num_requests_running is None
    restarted = delta(after, before)  # counters went down: an engine restart, count from zero
    assert restarted.preemptions == 3.0


async def test_scrape_failure_is_a_scrape_error() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(ScrapeError, match="ConnectError"):
            await scrape(http, f"http://127.0.0.1:{free_port()}")


SEED = ["llama-2-13b", "-tp", "8", "--max-model-len", "8192"]


async def test_simulator_metrics_before_after_and_polled_kv_peak(sim_server) -> None:
    # Speed-up 20: the run lasts long enough for several polls of the (now larger) /metrics page on a busy box.
    server = sim_server.start([*SEED, "--sim-speedup", "20"])
    words = " ".join(["word"] * 5000)  # 5000 tokens under the simulator's tokenizer (+ none for BOS)
    reqs = [RequestSpec(f"r{i} {words}", None, 32) for i in range(8)]
    spec = WorkloadSpec(SyntheticRequests(8, LengthDist("fixed", value=1), LengthDist("fixed", value=1)),
                        Arrivals("concurrency", concurrency=8, time_scale=20))
    async with http_client() as http:
        before = await scrape(http, server.url)
        stop = asyncio.Event()
        polling = asyncio.ensure_future(poll(http, server.url, 0.005, stop))
        result = await replay(spec, reqs, StreamingClient(http, server.url, "llama-2-13b"))
        stop.set()
        snapshots = await polling
        after = await scrape(http, server.url)
    assert all(r.ok for r in result.results)
    d = delta(before, after)
    assert d.generation_tokens == sum(r.output_tokens for r in result.results) == 8 * 32
    assert d.prompt_tokens == sum(r.prompt_tokens or 0 for r in result.results) == 8 * 5001
    assert d.request_success == {"length": 8.0, "stop": 0.0, "abort": 0.0}
    assert d.preemptions == 0.0 and d.num_requests_running == 0.0 and d.num_requests_waiting == 0.0
    assert d.kv_cache_usage_perc == 0.0  # all finished
    hist = after.histogram("vllm:time_to_first_token_seconds")
    assert hist is not None and hist.count == 8.0 and hist.buckets[-1] == (float("inf"), 8.0)
    assert len(snapshots) > 5
    # 8 × ~5000 tokens in a KV cache of 187,664 tokens (see the simulator's startup log): ~21 %.
    top = peak(snapshots)
    assert top is not None and 0.10 < top < 0.25
    assert max(s.get("vllm:num_requests_running") or 0 for s in snapshots) >= 4
