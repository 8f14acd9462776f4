"""The engine core in virtual time: no sleeping, deterministic for a seed.

`evaluate()` answers "what would this configuration do on that box with this workload?" in
simulated hardware seconds — the oracle for benchmarks and the `sim-virtual` trial runner.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from autotuner.sim.accuracy import SIM_ACCURACY
from autotuner.sim.args import EngineConfig
from autotuner.sim.core import EngineCore, SimRequest
from autotuner.sim.memory import MemoryPlan, StartupError, plan_startup
from autotuner.sim.tokens import natural_output_len
from autotuner.stats import percentile

PERCENTILES = (50, 90, 95, 99)
# What a client measures beyond the engine core's steps: the API server tokenizes the request and
# hands it to the core, the first token comes back through the output processor and the SSE stream.
# The concurrency-1 TTFT rows of benchmarks/data/published_runs.yaml exceed the simulated prefill step
# by 6–17 ms (median 8.5 ms over five rows of two sources, 4090 and A100); the evaluator delays each
# request's entry into the core by that much, so TTFT and end-to-end latency carry it.
FRONTEND_LATENCY_S = 8.5e-3


@dataclass(frozen=True)
class EvalRequest:
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool = True
    arrival: float | None = None  # seconds from the start; None: sent when a client is free


@dataclass(frozen=True)
class SyntheticWorkload:
    """The `sim evaluate` workload flags: uniform prompt lengths, fixed outputs, unique prompts."""

    prompts: int = 32
    prompt_tokens: tuple[int, int] = (3000, 6000)
    output_tokens: int = 256
    concurrency: int | None = 8
    rate: float | None = None
    seed: int = 0

    def requests(self, vocab_size: int) -> list[EvalRequest]:
        lo, hi = self.prompt_tokens
        return synthetic_requests(self.prompts, lambda rng: rng.randint(lo, hi), lambda _rng: self.output_tokens,
                                  seed=self.seed, vocab_size=vocab_size, rate=self.rate)


def synthetic_requests(
    count: int,
    prompt_len: Callable[[random.Random], int],
    output_len: Callable[[random.Random], int],
    *,
    seed: int,
    vocab_size: int,
    rate: float | None = None,
    burst: tuple[int, float] | None = None,
    shared_prefix_tokens: int = 0,
    shared_prefix_fraction: float = 0.0,
    ignore_eos: bool = True,
) -> list[EvalRequest]:
    """Seeded requests for the evaluator: prompts made unique by a random first block (so no request
    flatters another's prefix cache) unless a share of them opens with a common prefix; arrivals
    Poisson at `rate`, in bursts of (size, interval), or None (a closed loop sends them)."""
    rng = random.Random(seed)
    filler = [(7 * k + 3) % vocab_size for k in range(65536)]
    shared = [rng.randrange(vocab_size) for _ in range(shared_prefix_tokens)]
    out: list[EvalRequest] = []
    t = 0.0
    for i in range(count):
        n = prompt_len(rng)
        head = shared if shared and rng.random() < shared_prefix_fraction else []
        unique = [rng.randrange(vocab_size) for _ in range(16)]
        arrival = None
        if rate:
            t += rng.expovariate(rate)
            arrival = t
        elif burst is not None:
            arrival = (i // burst[0]) * burst[1]
        out.append(EvalRequest((head + unique + filler)[:n], output_len(rng), ignore_eos, arrival))
    return out


@dataclass
class Evaluation:
    outcome: str  # ok | startup-failed | oom | invalid-flags
    reason: str | None
    oom_at_s: float | None = None
    metrics: dict[str, float | int | None] = field(default_factory=dict)
    memory: dict[str, object] = field(default_factory=dict)
    kv_cache_tokens: int | None = None
    preemptions: int = 0
    startup: dict[str, float] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)
    accuracy: str = SIM_ACCURACY.quote()  # the simulator's measured error, for whoever reads the numbers

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def config_summary(config: EngineConfig) -> dict[str, object]:
    return {
        "model": config.model_arg,
        "tensor_parallel_size": config.tensor_parallel_size,
        "max_model_len": config.max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "cpu_offload_gb": config.cpu_offload_gb,
        "offload_backend": config.offload_backend,
        "offload_group_size": config.offload_group_size,
        "offload_num_in_group": config.offload_num_in_group,
        "offload_prefetch_step": config.offload_prefetch_step,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_prefix_caching": config.enable_prefix_caching,
        "gpu": config.sim.gpu.name,
        "num_gpus": config.sim.num_gpus,
    }


def startup_summary(plan: MemoryPlan) -> dict[str, float]:
    gib = float(1 << 30)
    return {
        "requested_gib": plan.requested_bytes / gib,
        "weights_gib": plan.weights_bytes / gib,
        "offloaded_gib": plan.offloaded_bytes / gib,
        "activation_gib": plan.activation_peak_bytes / gib,
        "cudagraph_gib": plan.cudagraph_bytes / gib,
        "kv_cache_gib": plan.kv_cache_bytes / gib,
    }


def evaluate(config: EngineConfig, requests: list[EvalRequest], concurrency: int | None,
             sims_out: list[SimRequest] | None = None) -> Evaluation:
    """Run `requests` through the core. With `concurrency`, requests without an arrival time are sent
    by that many clients back to back (a closed loop); the others arrive at their times. `sims_out`
    receives the requests as the core left them (arrival, first token, finish), for a caller that
    replays the run's progress (early stopping in virtual time)."""
    summary = config_summary(config)
    try:
        plan = plan_startup(config)
    except StartupError as exc:
        return Evaluation("startup-failed", exc.message, config=summary)
    core = EngineCore(config, plan)
    seed = config.sim.seed
    pending: list[tuple[float, int, EvalRequest]] = []  # (arrival, index, request)
    closed_loop: list[tuple[int, EvalRequest]] = []
    for i, r in enumerate(requests):
        if r.arrival is None:
            closed_loop.append((i, r))
        else:
            pending.append((r.arrival + FRONTEND_LATENCY_S, i, r))
    heapq.heapify(pending)
    closed_loop.reverse()
    clients = concurrency if concurrency else (len(closed_loop) or 1)
    for _ in range(min(clients, len(closed_loop))):
        i, r = closed_loop.pop()
        heapq.heappush(pending, (FRONTEND_LATENCY_S, i, r))

    sims: list[SimRequest] = []
    last_token: dict[str, float] = {}  # request id → when its latest output token came out
    itl: list[float] = []  # gaps between consecutive output tokens of a request, as a client sees them
    now = 0.0
    peak = core.memory_used()
    oom_at: float | None = None
    reason: str | None = None
    while pending or core.has_work:
        while pending and pending[0][0] <= now:
            at_core, i, r = heapq.heappop(pending)
            sim = _admit(config, r, i, at_core - FRONTEND_LATENCY_S, seed)
            sims.append(sim)
            core.add_request(sim)
        if not core.has_work:
            now = pending[0][0]
            continue
        result = core.step(now)
        now = result.end
        if result.oom is not None:
            oom_at, reason = now, result.oom.message
            break
        peak = [max(p, u) for p, u in zip(peak, core.memory_used(), strict=True)]
        for req in result.emitted:
            if req.request_id in last_token:
                itl.append(now - last_token[req.request_id])
            last_token[req.request_id] = now
        for _ in result.finished:
            if closed_loop:
                i, r = closed_loop.pop()
                heapq.heappush(pending, (now + FRONTEND_LATENCY_S, i, r))

    if sims_out is not None:
        sims_out.extend(sims)
    total = plan.total_bytes
    evaluation = Evaluation(
        outcome="oom" if oom_at is not None else "ok",
        reason=reason,
        oom_at_s=oom_at,
        metrics=request_metrics(sims, len(requests), now, itl),
        memory={"peak_bytes": peak, "total_bytes": total, "peak_fraction": max(peak) / total,
                "steady_bytes": plan.steady_bytes},
        kv_cache_tokens=plan.kv_cache_tokens,
        preemptions=core.num_preemptions,
        startup=startup_summary(plan),
        config=summary,
    )
    return evaluation


def _admit(config: EngineConfig, r: EvalRequest, index: int, arrival: float, seed: int) -> SimRequest:
    max_tokens = max(1, min(r.max_tokens, config.max_model_len - len(r.prompt)))
    stop_at = max_tokens if r.ignore_eos else min(max_tokens, natural_output_len(r.prompt, seed))
    return SimRequest(f"req-{index}", r.prompt, max_tokens, arrival, stop_at)


def request_metrics(sims: list[SimRequest], total_requests: int, end: float,
                    itl: list[float] | None = None) -> dict[str, float | int | None]:
    """`itl`: every inter-token gap (the time between two consecutive output tokens of one request);
    without it the ITL percentiles are None rather than a stand-in such as TPOT."""
    done = [s for s in sims if s.finished_at is not None]
    start = min((s.arrival for s in sims), default=0.0)
    duration = max(end - start, 1e-9)
    out_tokens = sum(s.output_len for s in done)
    in_tokens = sum(s.prompt_len for s in done)
    ttft = [s.first_token - s.arrival for s in done if s.first_token is not None]
    tpot = [
        (s.finished_at - s.first_token) / (s.output_len - 1)
        for s in done
        if s.first_token is not None and s.finished_at is not None and s.output_len > 1
    ]
    e2e = [s.finished_at - s.arrival for s in done if s.finished_at is not None]
    metrics: dict[str, float | int | None] = {
        "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (out_tokens + in_tokens) / duration,
        "requests_per_s": len(done) / duration,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for q in PERCENTILES:
            metrics[f"{name}_p{q}_s"] = percentile(values, q)
        # vllm bench serve prints means beside medians; published runs often quote only the mean.
        metrics[f"{name}_mean_s"] = sum(values) / len(values) if values else None
    for q in PERCENTILES:
        metrics[f"itl_p{q}_s"] = percentile(itl or [], q)
    metrics.update(
        completed=len(done),
        failed=total_requests - len(done),
        duration_s=duration,
        output_tokens=out_tokens,
        prompt_tokens=in_tokens,
    )
    return metrics
