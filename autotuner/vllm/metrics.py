"""vLLM's Prometheus metric names and bucket rules (V1 engine, 0.32: vllm/v1/metrics/loggers.py).

Read by the simulator (which exposes them) and by the production watcher (which reads them), so the
two can never disagree on a name.
"""

from __future__ import annotations

NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0..1
NUM_PREEMPTIONS = "vllm:num_preemptions"  # counter family; the sample is NUM_PREEMPTIONS + "_total"
PROMPT_TOKENS = "vllm:prompt_tokens"  # counter family
GENERATION_TOKENS = "vllm:generation_tokens"  # counter family
REQUEST_SUCCESS = "vllm:request_success"  # counter family, label finished_reason
# Per finished request: its prompt and output lengths, buckets from build_1_2_5_buckets(max_model_len).
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"


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
