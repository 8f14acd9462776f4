"""The simulated engine's loop: requests in, one scheduler step at a time on a scaled clock, tokens out.

The engine side of `autotuner sim serve`, apart from its HTTP API (`autotuner.sim.api`) as vLLM keeps
its engine core apart from its entrypoints. `SimEngine` drives the `EngineCore` (scheduling and KV
state, `autotuner.sim.core`): each step ends at its scaled wall-clock time (simulated seconds /
--sim-speedup); tokens go to each request's `Stream`, the step's counts to the engine's Prometheus
metrics, memory to the TP workers, and vLLM's periodic stats line to the log. A runtime OOM or a
lost worker kills the engine as vLLM's dies: every stream fails and `died` is set.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass, field

from autotuner.sim import tokens
from autotuner.sim.args import VLLM_VERSION, EngineConfig
from autotuner.sim.core import EngineCore, SimRequest, StepResult
from autotuner.sim.metrics_exporter import EngineMetrics
from autotuner.sim.vllm_log import VllmLog, scheduler_output
from autotuner.sim.worker_pool import SimWorkerError, WorkerPool
from autotuner.vllm import log_patterns

LOG_INTERVAL_S = 10.0  # vLLM's periodic stats line, simulated seconds
FINISHED_LOG_SIZE = 10_000

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass(eq=False)
class Stream:
    """One request's path back to its HTTP response."""

    sim: SimRequest
    queue: asyncio.Queue[int | str | None] = field(default_factory=asyncio.Queue)
    key: int = 0


class SimEngine:
    """Drives the core: one step at a time, each ending at its scaled wall-clock time."""

    def __init__(self, config: EngineConfig, core: EngineCore, workers: WorkerPool, log: VllmLog) -> None:
        self.config = config
        self.core = core
        self.workers = workers
        self.log = log
        self.speedup = config.sim.speedup
        self.metrics = EngineMetrics(config.served_model_names[0], config.max_model_len)
        self.streams: dict[SimRequest, Stream] = {}
        self.dead = False
        self.died = asyncio.Event()
        self._wake = asyncio.Event()
        self._wall0 = time.perf_counter()
        self._vnow = 0.0
        self._memory = core.memory_used()
        self._next_log = LOG_INTERVAL_S
        self._window = [0, 0]  # prompt, generation tokens since the last stats line
        self._last_token: dict[SimRequest, float] = {}
        self.finished_log: deque[dict[str, object]] = deque(maxlen=FINISHED_LOG_SIZE)

    def vclock(self) -> float:
        """Simulated time now: the engine's clock, never behind the wall clock."""
        return max(self._vnow, (time.perf_counter() - self._wall0) * self.speedup)

    def submit(self, prompt: list[int], max_tokens: int, ignore_eos: bool, arrival: float | None = None) -> Stream:
        """`arrival`: when the request reached the server (simulated seconds), stamped before parsing and
        tokenising, which cost wall time the simulated hardware would not spend."""
        if self.dead:
            raise RuntimeError(ENGINE_DEAD)
        now = self.vclock() if arrival is None else arrival
        stop_at = max_tokens if ignore_eos else min(max_tokens, tokens.natural_output_len(prompt, 0))
        request_id = uuid.uuid4().hex
        sim = SimRequest(request_id, prompt, max_tokens, now, stop_at)
        stream = Stream(sim, key=zlib.crc32(request_id.encode()))
        self.streams[sim] = stream
        self.core.add_request(sim)
        self._wake.set()
        return stream

    def abort(self, stream: Stream) -> None:
        if stream.sim in self.streams:
            self.core.abort(stream.sim)
            self._drop(stream.sim)
            self.metrics.aborted()

    async def run(self) -> None:
        while not self.dead:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self.vclock()
            result = self.core.step(start)
            # Sleep until the step's end on the scaled clock; a late loop catches up without sleeping.
            delay = self._wall0 + result.end / self.speedup - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self._vnow = result.end
            if result.oom is not None:
                await self._die(result)
                return
            self._deliver(result)
            try:
                await self._update_memory()
            except SimWorkerError:
                self._lost_worker()
                return
            self._maybe_log_stats(result.end)

    def _deliver(self, result: StepResult) -> None:
        m = self.metrics
        m.step(result.num_tokens, len(result.emitted))
        prompt_tokens = result.num_tokens - len(result.emitted)
        for req in result.emitted:
            stream = self.streams.get(req)
            if stream is None:
                continue
            if req.output_len == 1:
                m.first_token(result.end - req.arrival, (req.first_scheduled or req.arrival) - req.arrival,
                              req.prompt_len)
            else:
                m.next_token(result.end - self._last_token.get(req, result.end))
            self._last_token[req] = result.end
            stream.queue.put_nowait(req.output_len - 1)
        for req in result.finished:
            stream = self.streams.get(req)
            if stream is None:
                continue
            m.finished(result.end - req.arrival, req.prompt_len, req.output_len, req.finish_reason or "length")
            self.finished_log.append({
                "id": req.request_id, "arrival_s": req.arrival, "first_token_s": req.first_token,
                "finished_s": req.finished_at, "prompt_tokens": req.prompt_len,
                "output_tokens": req.output_len, "preemptions": req.preemptions})
            stream.queue.put_nowait(None)
            self._drop(req)
        core = self.core
        m.scheduler_state(running=len(core.running), waiting=len(core.waiting), kv_cache_usage=core.kv_usage,
                          preemptions=core.num_preemptions, prefix_queries=core.prefix_queries,
                          prefix_hits=core.prefix_hits)
        self._window[0] += max(0, prompt_tokens)
        self._window[1] += len(result.emitted)

    def _drop(self, req: SimRequest) -> None:
        self.streams.pop(req, None)
        self._last_token.pop(req, None)

    async def _update_memory(self) -> None:
        used = self.core.memory_used()
        if used != self._memory:
            self._memory = used
            await asyncio.to_thread(self.workers.set_bytes, used)

    def _maybe_log_stats(self, now: float) -> None:
        if now < self._next_log:
            return
        elapsed = LOG_INTERVAL_S + (now - self._next_log)
        prompt, gen = self._window
        hit = 100.0 * self.core.prefix_hits / self.core.prefix_queries if self.core.prefix_queries else 0.0
        self.log.api(
            f"Engine 000: Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, Avg generation "
            f"throughput: {gen / elapsed:.1f} tokens/s, Running: {len(self.core.running)} reqs, Waiting: "
            f"{len(self.core.waiting)} reqs, GPU KV cache usage: {100 * self.core.kv_usage:.1f}%, "
            f"Prefix cache hit rate: {hit:.1f}%",
            where="loggers.py:123",
        )
        self._window = [0, 0]
        self._next_log = now + LOG_INTERVAL_S

    def _lost_worker(self) -> None:
        """A TP worker died under us (killed, crashed): vLLM's executor notices, shuts down, and the
        engine core dies with it, as in `_die`."""
        self.dead = True
        for rank, code in self.workers.dead_ranks().items():
            self.log.core(f"Worker proc VllmWorker-{rank} died unexpectedly (exit code: {code}), shutting down "
                          "executor.", where="multiproc_executor.py:315", level="ERROR")
        self._fail_streams()

    async def _die(self, result: StepResult) -> None:
        """A runtime CUDA OOM: the engine core dies, requests fail, /health turns 503."""
        assert result.oom is not None
        self.dead = True
        log = self.log
        self._dump_step(result)
        log.core("EngineCore encountered a fatal error.", where="core.py:710", level="ERROR")
        log.core(
            "Traceback (most recent call last):\n"
            '  File "vllm/v1/engine/core.py", line 701, in run_engine_core\n'
            "    engine_core.run_busy_loop()\n"
            '  File "vllm/v1/worker/gpu_model_runner.py", line 2301, in execute_model\n'
            "    hidden_states = self.model(...)\n" + result.oom.message,
            where="core.py:710",
            level="ERROR",
        )
        self._fail_streams()

    def _dump_step(self, result: StepResult) -> None:
        """What vLLM's engine core logs of the failed step before re-raising (vllm/v1/engine/core.py
        `log_error_detail` → vllm/logging_utils/dump_input.py): the config, the scheduler output with the
        lengths of the prompts it held, the scheduler's counts."""
        assert result.oom is not None
        c, core = self.config, self.core
        header_where, dump_where, stats_where = log_patterns.DUMP_WHERE
        config = (f"model={c.model_arg!r}, tensor_parallel_size={c.tensor_parallel_size}, "
                  f"max_seq_len={c.max_model_len}, max_num_batched_tokens={c.max_num_batched_tokens}, "
                  f"max_num_seqs={c.max_num_seqs}, enable_prefix_caching={c.enable_prefix_caching}, "
                  f"chunked_prefill_enabled={c.enable_chunked_prefill}")
        self.log.core(log_patterns.DUMP_INPUT_HEADER.format(version=VLLM_VERSION, config=config),
                      where=header_where, level="ERROR")
        self.log.core(log_patterns.SCHEDULER_DUMP + scheduler_output(result.oom.step), where=dump_where,
                      level="ERROR")
        self.log.core(log_patterns.SCHEDULER_STATS_DUMP + f"SchedulerStats(num_running_reqs={len(core.running)}, "
                      f"num_waiting_reqs={len(core.waiting)}, kv_cache_usage={core.kv_usage}, "
                      f"num_preemptions={core.num_preemptions})", where=stats_where, level="ERROR")

    def _fail_streams(self) -> None:
        log = self.log
        log.api("AsyncLLM output_handler failed.", where="async_llm.py:480", level="ERROR")
        log.api(f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}", where="async_llm.py:480",
                level="ERROR")
        for stream in list(self.streams.values()):
            stream.queue.put_nowait(ENGINE_DEAD)
        self.streams.clear()
        self.died.set()
