"""vLLM's Prometheus metrics for one simulated engine, as the simulator exposes them on `/metrics`.

Kept the way vLLM's `PrometheusStatLogger` keeps them (vllm/v1/metrics/loggers.py): prometheus_client
Counters, Gauges and Histograms labelled by model name and engine index, rendered by
`generate_latest`. Each engine has its own `CollectorRegistry`, so several simulated engines in one
process (tests, the in-process backends) never collide on a name. Names, labels and buckets come from
`autotuner.vllm.metrics`, which the readers of `/metrics` use too.

Durations are simulated hardware seconds (the engine's own clock), like a real engine's on real
GPUs; divide by the speed-up from `/version` to compare with wall-clock measurements.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from autotuner.vllm import metrics as names

# What vLLM's /metrics answers a scraper that asks for nothing in particular.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class EngineMetrics:
    """The metrics of engine `engine_index` serving `model_name`, on a registry of its own.

    The engine loop records into it through the methods below, never into the metrics themselves:
    `render` keeps the page it made until the next record, so an idle engine's scrapes cost nothing
    (prometheus_client takes milliseconds per page, time the scaled clock would lose). Counters only
    go up: the scheduler's running totals (preemptions, prefix-cache tokens) are handed over whole in
    `scheduler_state` and counted by their increase, as vLLM counts per step.
    """

    def __init__(self, model_name: str, max_model_len: int = 8192, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry()
        self._labels = {names.LABEL_MODEL_NAME: model_name, names.LABEL_ENGINE: str(engine_index)}
        self._running = self._gauge(names.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.")
        self._waiting = self._gauge(names.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.")
        self._kv_cache_usage = self._gauge(names.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.")
        self._prefix_queries = self._counter(
            names.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.")
        self._prefix_hits = self._counter(
            names.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.")
        self._preemptions = self._counter(names.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.")
        self._prompt_tokens = self._counter(names.PROMPT_TOKENS, "Number of prefill tokens processed.")
        self._generation_tokens = self._counter(names.GENERATION_TOKENS, "Number of generation tokens processed.")
        success = Counter(names.REQUEST_SUCCESS, "Count of successfully processed requests.",
                          [*names.ENGINE_LABELS, names.LABEL_FINISHED_REASON], registry=self.registry)
        self._success = {reason: success.labels(**self._labels, **{names.LABEL_FINISHED_REASON: reason})
                        for reason in names.FINISHED_REASONS}
        self._ttft = self._histogram(names.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.",
                                    names.TIME_TO_FIRST_TOKEN_BUCKETS)
        self._itl = self._histogram(names.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.",
                                   names.INTER_TOKEN_LATENCY_BUCKETS)
        self._e2e = self._histogram(names.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.",
                                   names.REQUEST_LATENCY_BUCKETS)
        self._queue = self._histogram(names.REQUEST_QUEUE_TIME,
                                     "Histogram of time spent in WAITING phase for request.",
                                     names.REQUEST_LATENCY_BUCKETS)
        self._iteration_tokens = self._histogram(names.ITERATION_TOKENS,
                                                "Histogram of number of tokens per engine_step.",
                                                names.ITERATION_TOKENS_BUCKETS)
        request_buckets = names.build_1_2_5_buckets(max_model_len)  # the top bucket is max_model_len, as in vLLM
        self._request_prompt = self._histogram(names.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.",
                                              request_buckets)
        self._request_generation = self._histogram(names.REQUEST_GENERATION_TOKENS,
                                                  "Number of generation tokens processed.", request_buckets)
        self._totals = {"preemptions": 0, "prefix_queries": 0, "prefix_hits": 0}
        self._page: bytes | None = None  # the last render, until the next record

    def _gauge(self, name: str, help_text: str) -> Gauge:
        return Gauge(name, help_text, names.ENGINE_LABELS, registry=self.registry).labels(**self._labels)

    def _counter(self, name: str, help_text: str) -> Counter:
        return Counter(name, help_text, names.ENGINE_LABELS, registry=self.registry).labels(**self._labels)

    def _histogram(self, name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, help_text, names.ENGINE_LABELS, buckets=buckets,
                         registry=self.registry).labels(**self._labels)

    def step(self, num_tokens: int, generated: int) -> None:
        """One engine step: the tokens it scheduled, of which `generated` were output tokens."""
        self._page = None
        self._iteration_tokens.observe(num_tokens)
        self._generation_tokens.inc(generated)

    def first_token(self, ttft: float, queue_time: float, prompt_tokens: int) -> None:
        self._page = None
        self._ttft.observe(ttft)
        self._queue.observe(queue_time)
        self._prompt_tokens.inc(prompt_tokens)

    def next_token(self, inter_token_latency: float) -> None:
        self._page = None
        self._itl.observe(inter_token_latency)

    def finished(self, e2e: float, prompt_tokens: int, output_tokens: int, reason: str) -> None:
        """A request finished (any reason but abort, as vLLM counts its lengths)."""
        self._page = None
        self._e2e.observe(e2e)
        self._request_prompt.observe(prompt_tokens)
        self._request_generation.observe(output_tokens)
        self._success[reason].inc()

    def aborted(self) -> None:
        self._page = None
        self._success["abort"].inc()

    def scheduler_state(self, *, running: int, waiting: int, kv_cache_usage: float, preemptions: int,
                        prefix_queries: int, prefix_hits: int) -> None:
        """The scheduler after a step: queue gauges, and its running totals counted by their increase."""
        self._page = None
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv_cache_usage.set(kv_cache_usage)
        for key, counter, total in (("preemptions", self._preemptions, preemptions),
                                    ("prefix_queries", self._prefix_queries, prefix_queries),
                                    ("prefix_hits", self._prefix_hits, prefix_hits)):
            if total > self._totals[key]:
                counter.inc(total - self._totals[key])
                self._totals[key] = total

    def render(self) -> bytes:
        """The text exposition (format 0.0.4), as `CONTENT_TYPE` says."""
        if self._page is None:
            self._page = generate_latest(self.registry)
        return self._page
