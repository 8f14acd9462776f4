"""vLLM's Prometheus metrics, as the simulator exposes them on `/metrics`.

Durations are simulated hardware seconds (the engine's own clock), like a real engine's on real
GPUs; divide by the speed-up from `/version` to compare with wall-clock measurements.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from autotuner.vllm import metrics as names

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            lines.append(f'{self.name}_bucket{{{labels},le="{float(bound)}"}} {float(running)}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {float(self.n)}')
        lines.append(f"{self.name}_count{{{labels}}} {float(self.n)}")
        lines.append(f"{self.name}_sum{{{labels}}} {self.total}")
        return lines


@dataclass
class EngineMetrics:
    model_name: str
    max_model_len: int = 8192  # the request length histograms' top bucket, as in vLLM
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    success: dict[str, int] = field(default_factory=dict)  # by finished_reason
    prefix_queries: int = 0
    prefix_hits: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(
        "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(
        "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
        LATENCY_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(
        "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", TOKEN_BUCKETS))
    request_prompt: Histogram = field(init=False)
    request_generation: Histogram = field(init=False)

    def __post_init__(self) -> None:
        buckets = tuple(float(b) for b in names.build_1_2_5_buckets(self.max_model_len))
        self.request_prompt = Histogram(names.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.",
                                        buckets)
        self.request_generation = Histogram(names.REQUEST_GENERATION_TOKENS,
                                            "Number of generation tokens processed.", buckets)

    def finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """A request finished (any reason but abort, as vLLM counts them)."""
        self.request_prompt.observe(prompt_tokens)
        self.request_generation.observe(output_tokens)

    def render(self) -> str:
        labels = f'engine="0",model_name="{self.model_name}"'
        lines: list[str] = []

        def scalar(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{{{labels}{extra}}} {float(value)}")

        scalar(names.NUM_REQUESTS_RUNNING, "gauge", "Number of requests in model execution batches.",
               self.running)
        scalar(names.NUM_REQUESTS_WAITING, "gauge", "Number of requests waiting to be processed.",
               self.waiting)
        scalar(names.KV_CACHE_USAGE, "gauge", "KV-cache usage. 1 means 100 percent usage.",
               self.kv_cache_usage)
        scalar("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of "
               "queried tokens.", self.prefix_queries)
        scalar("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached "
               "tokens.", self.prefix_hits)
        scalar(names.counter_sample(names.NUM_PREEMPTIONS), "counter",
               "Cumulative number of preemption from the engine.", self.preemptions)
        scalar(names.counter_sample(names.PROMPT_TOKENS), "counter", "Number of prefill tokens processed.",
               self.prompt_tokens)
        scalar(names.counter_sample(names.GENERATION_TOKENS), "counter", "Number of generation tokens processed.",
               self.generation_tokens)
        lines.append("# HELP vllm:request_success_total Count of successfully processed requests.")
        lines.append("# TYPE vllm:request_success_total counter")
        for reason in ("stop", "length", "abort"):
            lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                         f"{float(self.success.get(reason, 0))}")
        for hist in (self.ttft, self.itl, self.e2e, self.queue, self.iteration_tokens, self.request_prompt,
                     self.request_generation):
            lines += hist.render(labels)
        return "\n".join(lines) + "\n"
