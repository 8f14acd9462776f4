"""Send a workload through a client on its schedule: warm-up first (kept apart), then the measured
part under the arrival process, within the request and duration caps.

Cancelling the replay (the caller does so when the memory monitor trips) cancels every in-flight
request; each is recorded as failed with error "cancelled", and `Replayer.result()` still returns all
that was measured, so an aborted trial keeps its evidence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from autotuner.workload.arrivals import send_offsets
from autotuner.workload.client import RequestResult
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import WorkloadSpec

CANCELLED = "cancelled"
log = structlog.get_logger(__name__)

# Hears ("request", {phase, done, total, failed, output_tokens_per_s}) after each finished request;
# set by whoever shows progress (a context variable: nothing to pass through a trial).
RequestListener = Callable[[str, dict[str, Any]], None]
request_listener: ContextVar[RequestListener | None] = ContextVar("request_listener", default=None)


class Sender(Protocol):
    async def send(self, req: RequestSpec, scheduled_at: float | None = None) -> RequestResult: ...


@dataclass
class ReplayResult:
    results: list[RequestResult]  # measured requests that were sent, in request order
    warmup: list[RequestResult]
    start: float  # perf_counter at the start of the measured phase
    end: float
    wall_start: float  # time.time() at `start`: the run's one wall-clock anchor
    time_scale: float
    cancelled: bool = False
    not_sent: int = 0  # measured requests left unsent by the duration cap or cancellation

    @property
    def duration_s(self) -> float:
        return self.end - self.start


@dataclass
class _Phase:
    slots: list[RequestResult | None] = field(default_factory=list)
    finished: int = 0  # as heard by a progress listener
    failed: int = 0

    def done(self) -> list[RequestResult]:
        return [r for r in self.slots if r is not None]


class Replayer:
    def __init__(self, spec: WorkloadSpec, requests: Sequence[RequestSpec], client: Sender) -> None:
        self.spec = spec
        self.client = client
        n_warm = min(spec.warmup_requests, len(requests))
        self._warm_reqs = list(requests[:n_warm])
        measured = list(requests[n_warm:])
        if spec.max_requests is not None:
            measured = measured[: spec.max_requests]
        self._reqs = measured
        self._warm = _Phase([None] * len(self._warm_reqs))
        self._measured = _Phase([None] * len(measured))
        self._start = self._end = time.perf_counter()
        self._wall_start = time.time()
        self._cancelled = False
        self._finished = False
        # A progress bar (set around a `measure` or `verify` run) hears each finished request.
        self._listener = request_listener.get()
        self._tokens = 0

    async def run(self) -> ReplayResult:
        try:
            if self._warm_reqs:
                await self._closed_loop(self._warm_reqs, self._warm, deadline=None)
            self._start, self._wall_start = time.perf_counter(), time.time()
            deadline = None
            if self.spec.max_duration_s is not None:
                deadline = self._start + self.spec.max_duration_s / self.spec.arrivals.time_scale
            offsets = send_offsets(self.spec.arrivals, self._reqs, self.spec.seed)
            if offsets is None:
                await self._closed_loop(self._reqs, self._measured, deadline)
            else:
                await self._open_loop(offsets, deadline)
        except asyncio.CancelledError:
            self._cancelled = True
            raise
        finally:
            self._end = time.perf_counter()
            self._finished = True
        return self.result()

    def result(self) -> ReplayResult:
        """What has been measured so far; complete after `run()` returned or was cancelled."""
        sent = self._measured.done()
        return ReplayResult(sent, self._warm.done(), self._start,
                            self._end if self._finished else time.perf_counter(), self._wall_start,
                            self.spec.arrivals.time_scale, self._cancelled, len(self._reqs) - len(sent))

    async def _one(self, phase: _Phase, index: int, req: RequestSpec, scheduled_at: float) -> None:
        try:
            phase.slots[index] = await self.client.send(req, scheduled_at)
            if self._listener is not None:
                self._heard(phase, phase.slots[index])  # type: ignore[arg-type]
        except asyncio.CancelledError:
            phase.slots[index] = RequestResult(ok=False, error=CANCELLED, scheduled_at=scheduled_at,
                                               finished_at=time.perf_counter(),
                                               target_prompt_tokens=req.target_prompt_tokens)
            raise

    def _heard(self, phase: _Phase, result: RequestResult) -> None:
        warm = phase is self._warm
        if not warm:
            self._tokens += result.output_tokens
        phase.finished += 1
        phase.failed += not result.ok
        elapsed = time.perf_counter() - self._start
        try:
            self._listener("request", {  # type: ignore[misc]
                "phase": "warm-up" if warm else "workload", "done": phase.finished, "total": len(phase.slots),
                "failed": phase.failed,
                "output_tokens_per_s": None if warm or elapsed <= 0 else self._tokens / elapsed})
        except Exception:
            log.exception("replay.listener_failed")

    async def _closed_loop(self, reqs: list[RequestSpec], phase: _Phase, deadline: float | None) -> None:
        queue = iter(enumerate(reqs))

        async def worker() -> None:
            for index, req in queue:  # one shared iterator: each request goes to exactly one worker
                now = time.perf_counter()
                if deadline is not None and now >= deadline:
                    return
                await self._one(phase, index, req, now)

        async with asyncio.TaskGroup() as tg:
            for _ in range(min(self.spec.arrivals.concurrency, len(reqs))):
                tg.create_task(worker())

    async def _open_loop(self, offsets: list[float], deadline: float | None) -> None:
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        async with asyncio.TaskGroup() as tg:
            for index in order:
                due = self._start + offsets[index]
                if deadline is not None and due >= deadline:
                    break
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(self._one(self._measured, index, self._reqs[index], due))


async def replay(spec: WorkloadSpec, requests: Sequence[RequestSpec], client: Sender) -> ReplayResult:
    """The first `spec.warmup_requests` of `requests` are the warm-up (run closed-loop at the spec's
    concurrency and finished before measuring starts). For partial results after cancellation, use
    `Replayer` and its `result()`."""
    return await Replayer(spec, requests, client).run()
