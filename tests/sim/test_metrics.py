"""The simulator's /metrics as prometheus_client renders it, read back by the project's one reader."""

from __future__ import annotations

import math

from autotuner.sim.metrics_exporter import EngineMetrics
from autotuner.vllm import metrics as names
from autotuner.workload import prometheus


def test_two_engines_in_one_process_keep_their_own_registries() -> None:
    first, second = EngineMetrics("a", 1000), EngineMetrics("b", 1000)  # no duplicate-timeseries error
    first.first_token(0.1, 0.0, 7)
    second.finished(1.0, 30, 4, "stop")
    a, b = prometheus.parse(first.render().decode()), prometheus.parse(second.render().decode())
    assert a.get(names.counter_sample(names.PROMPT_TOKENS), model_name="a", engine="0") == 7.0
    assert b.get(names.counter_sample(names.PROMPT_TOKENS)) == 0.0
    assert b.by_label(names.counter_sample(names.REQUEST_SUCCESS), names.LABEL_FINISHED_REASON) == {
        "stop": 1.0, "length": 0.0, "abort": 0.0}


def test_buckets_counters_and_gauges_come_from_the_vllm_names() -> None:
    m = EngineMetrics("m", 4096)
    m.finished(2.0, 300, 8, "length")
    m.first_token(0.3, 0.0, 300)
    m.scheduler_state(running=2, waiting=1, kv_cache_usage=0.5, preemptions=3, prefix_queries=10, prefix_hits=4)
    m.scheduler_state(running=0, waiting=0, kv_cache_usage=0.25, preemptions=5, prefix_queries=10, prefix_hits=4)
    snap = prometheus.parse(m.render().decode())
    prompt = snap.histogram(names.REQUEST_PROMPT_TOKENS)
    assert prompt is not None and prompt.count == 1.0 and prompt.sum == 300.0
    assert [le for le, _ in prompt.buckets] == [*map(float, names.build_1_2_5_buckets(4096)), math.inf]
    ttft = snap.histogram(names.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and [le for le, _ in ttft.buckets][:-1] == list(names.TIME_TO_FIRST_TOKEN_BUCKETS)
    assert snap.get(names.counter_sample(names.NUM_PREEMPTIONS)) == 5.0  # running totals counted by increase
    assert snap.get(names.counter_sample(names.PREFIX_CACHE_HITS)) == 4.0
    assert snap.get(names.KV_CACHE_USAGE) == 0.25 and snap.get(names.NUM_REQUESTS_RUNNING) == 0.0
    # As vLLM's default registry does, counters carry a _created sample beside _total.
    assert snap.get(names.PROMPT_TOKENS + "_created") is not None


def test_the_page_is_kept_until_the_next_record() -> None:
    m = EngineMetrics("m")
    page = m.render()
    assert m.render() is page  # an idle engine's scrapes cost nothing
    m.step(16, 1)
    after = prometheus.parse(m.render().decode())
    assert after.get(names.counter_sample(names.GENERATION_TOKENS)) == 1.0
    assert after.histogram(names.ITERATION_TOKENS).count == 1.0
