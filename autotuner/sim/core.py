"""The simulated engine core: vLLM V1's scheduler over paged KV blocks, timed by the roofline and
charged by the memory model. It knows no clock of its own: the engine loop
(`autotuner.sim.engine_loop`) drives it in scaled real time, the evaluator in virtual time, and both
get the same steps for the same inputs.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field, replace

from autotuner.sim.args import EngineConfig
from autotuner.sim.kv_cache import BlockPool, block_hashes
from autotuner.sim.memory import (
    AllocatorState,
    MemoryPlan,
    oom_message,
    runtime_step_bytes,
    sampler_bytes,
)
from autotuner.sim.noise import RunNoise
from autotuner.sim.roofline import Roofline, StepShape


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int  # after clamping to max_model_len
    arrival: float
    stop_at: int  # output length at which the request ends (EOS or max_tokens)
    status: Status = Status.WAITING
    num_computed: int = 0
    output_len: int = 0
    blocks: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    preemptions: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    _hashes: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + self.output_len

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class StepResult:
    start: float
    duration: float
    num_tokens: int
    scheduled: int
    emitted: list[SimRequest]  # requests that got one more output token in this step
    finished: list[SimRequest]
    preempted: int
    oom: OomEvent | None = None

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class ScheduledRequest:
    """One request of a step as vLLM's SchedulerOutput holds it (what its crash dump prints)."""

    request: SimRequest
    tokens: int  # scheduled in the step
    computed: int  # num_computed_tokens when the step began
    new: bool  # first scheduled in this step (scheduled_new_reqs); else a running one (scheduled_cached_reqs)
    resumed: bool = False  # back from a preemption: vLLM lists it among the cached, in resumed_req_ids


@dataclass(frozen=True)
class OomEvent:
    rank: int
    tried_bytes: int
    message: str
    step: tuple[ScheduledRequest, ...] = ()  # the step whose allocation failed


class EngineCore:
    """Add requests, call `step(now)` while `has_work`, read `memory_used()` for NVML."""

    def __init__(self, config: EngineConfig, plan: MemoryPlan, others_bytes: list[int] | None = None) -> None:
        self.config = config
        self.plan = plan
        self.block_size = config.block_size
        self.pool = BlockPool(plan.num_blocks, config.enable_prefix_caching)
        self.roofline = Roofline(config)
        tp = config.tensor_parallel_size
        others = others_bytes or [0] * tp
        self.allocators = [AllocatorState(plan.steady_bytes, others[r], plan.total_bytes) for r in range(tp)]
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._admitted_at = 0
        self.dead = False
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._sampler_per_row = sampler_bytes(config, 1)
        self.noise = RunNoise.draw(config.sim.noise, config.sim.seed, config.sim.run or 0, config.sim.replay,
                                   config.sim.within)

    # --- requests -------------------------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self._free(request)
        elif request.status is Status.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.ABORTED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running) and not self.dead

    def memory_used(self) -> list[int]:
        """Bytes each worker holds as NVML would report them."""
        return [a.used_bytes for a in self.allocators]

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    # --- one step -------------------------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        scheduled, preempted = self._schedule(now)
        shape, transient = self._shape(scheduled)
        duration = self.noise.step_seconds(self.roofline.step_seconds(shape))
        oom = self._charge_memory(self.noise.transient(transient), len(scheduled))
        if oom is not None:
            self.dead = True
            oom = replace(oom, step=self._failed_step(scheduled))
            return StepResult(now, duration, shape.num_tokens, len(scheduled), [], [], preempted, oom)
        end = now + duration
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        for req, n in scheduled:
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            if req.output_len == 0 and self.config.enable_prefix_caching:
                self._register_prompt_blocks(req)
            req.output_len += 1
            if req.first_token is None:
                req.first_token = end
            emitted.append(req)
            if req.output_len >= req.stop_at or req.num_tokens >= self.config.max_model_len:
                req.finish_reason = "length" if req.output_len >= req.max_tokens else "stop"
                req.finished_at = end
                req.status = Status.FINISHED
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            self._free(req)
        return StepResult(now, duration, shape.num_tokens, len(scheduled), emitted, finished, preempted)

    def _schedule(self, now: float) -> tuple[list[tuple[SimRequest, int]], int]:
        budget = self.config.max_num_batched_tokens
        bs = self.block_size
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            need = -(-(req.num_computed + n) // bs) - len(req.blocks)
            while need > self.pool.num_free:
                victim = self.running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            if req.status is not Status.RUNNING:
                break
            if need > 0:
                req.blocks += self.pool.allocate(need) or []
            scheduled.append((req, n))
            budget -= n
            i += 1
        self._admitted_at = len(scheduled)  # what follows was admitted from the queue in this step
        if preempted:
            return scheduled, preempted  # V1 admits nothing new in a step that had to preempt
        chunked = self.config.enable_chunked_prefill
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            hits: list[int] = []
            if req.num_computed == 0 and not req.blocks:
                hits = self._prefix_hits(req)
            computed = min(len(hits) * bs, req.num_tokens - 1)
            n = req.num_tokens - computed
            if not chunked and n > budget:
                self.pool.release(hits)
                break
            n = min(n, budget)
            # Admission needs blocks for the whole prompt, so that admitted prefills never stall.
            need = -(-req.num_tokens // bs) - len(hits)
            fresh = self.pool.allocate(need) if need <= self.pool.num_free else None
            if fresh is None:
                self.pool.release(hits)
                break
            self.waiting.popleft()
            req.blocks = hits + fresh
            req.num_computed = computed
            req.num_cached_tokens = max(req.num_cached_tokens, computed)
            req.status = Status.RUNNING
            if req.first_scheduled is None:
                req.first_scheduled = now
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        return scheduled, preempted

    def _failed_step(self, scheduled: list[tuple[SimRequest, int]]) -> tuple[ScheduledRequest, ...]:
        """The step as vLLM's scheduler output names it; the OOM left every count as it was before it."""
        out = []
        for i, (req, n) in enumerate(scheduled):
            admitted = i >= self._admitted_at
            out.append(ScheduledRequest(req, n, req.num_computed, new=admitted and req.preemptions == 0,
                                        resumed=admitted and req.preemptions > 0))
        return tuple(out)

    def _prefix_hits(self, req: SimRequest) -> list[int]:
        if not self.config.enable_prefix_caching:
            return []
        if req._hashes is None:
            req._hashes = block_hashes(req.prompt, self.block_size)
        hits = self.pool.lookup(req._hashes)
        self.prefix_queries += req.prompt_len
        self.prefix_hits += len(hits) * self.block_size
        return hits

    def _register_prompt_blocks(self, req: SimRequest) -> None:
        if req._hashes is None:
            req._hashes = block_hashes(req.prompt, self.block_size)
        for block, h in zip(req.blocks, req._hashes, strict=False):
            self.pool.register(block, h)

    def _preempt(self, req: SimRequest) -> None:
        """Recompute preemption: drop the KV blocks, back to the front of the queue."""
        self._free(req)
        req.num_computed = 0
        req.status = Status.WAITING
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _free(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []

    def _shape(self, scheduled: list[tuple[SimRequest, int]]) -> tuple[StepShape, int]:
        tokens = kv_read = pairs = 0
        prefill = False
        for req, n in scheduled:
            start = req.num_computed
            end = start + n
            tokens += n
            kv_read += end
            pairs += n * (start + end) // 2
            prefill = prefill or start < req.prompt_len
        shape = StepShape(tokens, len(scheduled), kv_read, pairs, prefill)
        return shape, runtime_step_bytes(self.config, tokens)

    def _charge_memory(self, transient: int, rows: int) -> OomEvent | None:
        for rank, alloc in enumerate(self.allocators):
            # The driver worker (rank 0) also gathers the logits and sorts them for sampling.
            need = transient + (rows * self._sampler_per_row if rank == 0 else 0)
            short = alloc.allocate(need)
            if short is not None:
                in_use = alloc.others_bytes + alloc.used_bytes
                message = oom_message(short, alloc.total_bytes, in_use, alloc.used_bytes)
                return OomEvent(rank, short, message)
        return None
