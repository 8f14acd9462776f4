"""vLLM's Prometheus metric names, label names and bucket bounds (V1 engine, 0.32: vllm/v1/metrics/loggers.py).

Read by the simulator (which exposes them) and by the readers of `/metrics` (the tuner's scrape, the
production watcher), so the two sides can never disagree on a name, a label or a bucket.

Counter families are named as prometheus_client's `Counter(name=...)` takes them; the exposed sample
is the family plus `_total` (`counter_sample`), with a `_created` sample beside it, as vLLM's are.
"""

from __future__ import annotations

# Labels every vLLM metric carries: the served model name and the engine index ("0" for one engine).
LABEL_MODEL_NAME = "model_name"
LABEL_ENGINE = "engine"
ENGINE_LABELS = (LABEL_MODEL_NAME, LABEL_ENGINE)
LABEL_FINISHED_REASON = "finished_reason"  # of REQUEST_SUCCESS
FINISHED_REASONS = ("stop", "length", "abort")

# Gauges
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # 0..1

# Counter families
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # tokens queried
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # tokens found cached
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # label LABEL_FINISHED_REASON

# Histograms, with their bucket bounds (+Inf is added by prometheus_client)
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
ITERATION_TOKENS = "vllm:iteration_tokens_total"  # a histogram despite the name
# Per finished request: its prompt and output lengths, buckets from build_1_2_5_buckets(max_model_len).
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"

TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # e2e and queue time
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's bucket bounds 1, 2, 5, 10, 20, 50, ... up to and including `max_value` (+Inf is added by
    prometheus_client). `build_1_2_5_buckets(100)` → (1, 2, 5, 10, 20, 50, 100)."""
    bounds: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(bounds)
            bounds.append(value)
        exponent += 1


def counter_sample(family: str) -> str:
    """The sample name of a counter family as the text exposition writes it."""
    return family + "_total"
