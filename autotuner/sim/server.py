"""`autotuner sim serve`: a process that a vLLM client cannot tell from `vllm serve` on the simulated
GPUs. The engine core runs in scaled real time (simulated seconds / --sim-speedup); TP workers are
child processes holding the simulated GPU memory, so NVML (`autotuner.sim.nvml`) sees it as it
would see vLLM's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from autotuner.sim import tokens
from autotuner.sim.args import VLLM_VERSION, EngineConfig
from autotuner.sim.core import EngineCore, SimRequest, StepResult
from autotuner.sim.gpu_state import GpuHost, GpuInventoryConflict, make_gpus, state_dir_from_env
from autotuner.sim.memory import CUDA_CONTEXT_BYTES, MemoryPlan, StartupError, gib, plan_startup, prefetch_init_line
from autotuner.sim.metrics import EngineMetrics
from autotuner.sim.noise import RunNoise, next_run
from autotuner.sim.vllm_log import VllmLog
from autotuner.sim.worker_pool import SimWorkerError, WorkerPool

# Simulated seconds of each startup phase (before the speed-up).
INIT_S = 6.0
LOAD_GBPS = 1.5  # weights read per rank from the page cache / NVMe
PROFILE_S = 2.0
GRAPH_CAPTURE_S = 9.0
LOG_INTERVAL_S = 10.0  # vLLM's periodic stats line, simulated seconds
# After the engine dies, the API server lingers this long (wall) before exiting, as vLLM's does
# while it fails requests and tears down.
DEATH_LINGER_S = 0.5
FINISHED_LOG_SIZE = 10_000
SHUTDOWN_WATCHDOG_S = 8.0

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
            self.metrics.success["abort"] = self.metrics.success.get("abort", 0) + 1

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
        m.iteration_tokens.observe(result.num_tokens)
        m.preemptions = self.core.num_preemptions
        m.prefix_queries, m.prefix_hits = self.core.prefix_queries, self.core.prefix_hits
        m.generation_tokens += len(result.emitted)
        prompt_tokens = result.num_tokens - len(result.emitted)
        for req in result.emitted:
            stream = self.streams.get(req)
            if stream is None:
                continue
            if req.output_len == 1:
                m.ttft.observe(result.end - req.arrival)
                m.queue.observe((req.first_scheduled or req.arrival) - req.arrival)
                m.prompt_tokens += req.prompt_len
            else:
                m.itl.observe(result.end - self._last_token.get(req, result.end))
            self._last_token[req] = result.end
            stream.queue.put_nowait(req.output_len - 1)
        for req in result.finished:
            stream = self.streams.get(req)
            if stream is None:
                continue
            m.e2e.observe(result.end - req.arrival)
            m.finished(req.prompt_len, req.output_len)
            self.finished_log.append({
                "id": req.request_id, "arrival_s": req.arrival, "first_token_s": req.first_token,
                "finished_s": req.finished_at, "prompt_tokens": req.prompt_len,
                "output_tokens": req.output_len, "preemptions": req.preemptions})
            reason = req.finish_reason or "length"
            m.success[reason] = m.success.get(reason, 0) + 1
            stream.queue.put_nowait(None)
            self._drop(req)
        m.running, m.waiting = len(self.core.running), len(self.core.waiting)
        m.kv_cache_usage = self.core.kv_usage
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

    def _fail_streams(self) -> None:
        log = self.log
        log.api("AsyncLLM output_handler failed.", where="async_llm.py:480", level="ERROR")
        log.api(f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}", where="async_llm.py:480",
                level="ERROR")
        for stream in list(self.streams.values()):
            stream.queue.put_nowait(ENGINE_DEAD)
        self.streams.clear()
        self.died.set()


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def build_app(config: EngineConfig, engine: SimEngine, started: float) -> Starlette:
    names = config.served_model_names
    vocab = config.model.vocab_size
    max_len = config.max_model_len

    def check_auth(request: Request) -> Response | None:
        if (config.api_key and request.url.path.startswith("/v1")
                and request.headers.get("authorization") != f"Bearer {config.api_key}"):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    async def read_body(request: Request) -> dict[str, object]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "Invalid JSON body", "BadRequestError") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object", "BadRequestError")
        return body

    def check_model(body: dict[str, object]) -> str:
        model = body.get("model") or names[0]
        if model not in names:
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                           "NotFoundError", "model")
        return str(model)

    def prompt_ids(body: dict[str, object], chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list", "BadRequestError", "messages")
            return tokens.encode(tokens.render_chat(messages), vocab)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tokens.encode(prompt, vocab)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) % vocab for t in prompt]
        raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids",
                       "BadRequestError", "prompt")

    async def health(request: Request) -> Response:
        return Response(status_code=503 if engine.dead else 200)

    async def version(request: Request) -> Response:
        sim = config.sim
        return JSONResponse({"version": VLLM_VERSION, "simulator": {
            "speedup": sim.speedup, "gpu": sim.gpu.name, "gpus": sim.num_gpus, "seed": sim.seed,
            "noise": sim.noise, "run": sim.run}})

    async def models(request: Request) -> Response:
        if (denied := check_auth(request)) is not None:
            return denied
        data = [{"id": n, "object": "model", "created": int(started), "owned_by": "vllm",
                 "root": config.model_arg, "parent": None, "max_model_len": max_len} for n in names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(request: Request) -> Response:
        try:
            body = await read_body(request)
            check_model(body)
            ids = prompt_ids(body, chat="messages" in body)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"count": len(ids), "max_model_len": max_len, "tokens": ids})

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool) -> Response:
        arrival = engine.vclock()
        if (denied := check_auth(request)) is not None:
            return denied
        try:
            body = await read_body(request)
            model = check_model(body)
            ids = prompt_ids(body, chat)
            if len(ids) >= max_len:
                raise ApiError(400, f"This model's maximum context length is {max_len} tokens. However, "
                               f"your prompt contains {len(ids)} input tokens. Please reduce the length of "
                               "the input prompt.", "BadRequestError")
            requested = body.get("max_completion_tokens") or body.get("max_tokens")
            if requested is None:
                requested = max_len - len(ids) if chat else 16
            if not isinstance(requested, int) or requested < 1:
                raise ApiError(400, "max_tokens must be a positive integer", "BadRequestError", "max_tokens")
            max_tokens = min(requested, max_len - len(ids))  # vLLM clamps silently
            if engine.dead:
                raise ApiError(500, ENGINE_DEAD, "InternalServerError")
            stream = engine.submit(ids, max_tokens, bool(body.get("ignore_eos", False)), arrival)
        except ApiError as exc:
            return exc.response()
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        shape = _Shape(chat, model, len(ids), stream.key, stream.sim.request_id)
        if body.get("stream"):
            events = _sse(engine, stream, shape, include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return await _whole(engine, stream, shape)

    async def sim_requests(request: Request) -> Response:
        """The simulator's own record of recent requests, in simulated seconds, keyed by the id the
        response carries: what the engine scheduled, for checking what a client measured."""
        return JSONResponse({"speedup": config.sim.speedup, "requests": list(engine.finished_log)})

    app = Starlette(routes=[
        Route("/health", health), Route("/ping", health), Route("/version", version),
        Route("/v1/models", models), Route("/metrics", metrics),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/sim/requests", sim_requests),
    ])
    return app


@dataclass(frozen=True)
class _Shape:
    """How one response's chunks look (completion or chat)."""

    chat: bool
    model: str
    prompt_tokens: int
    key: int
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, object]:
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish, "stop_reason": None}
            kind = "chat.completion.chunk"
            prefix = "chatcmpl-"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
            kind = "text_completion"
            prefix = "cmpl-"
        return {"id": prefix + self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}


def _sse_line(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _sse(engine: SimEngine, stream: Stream, shape: _Shape, include_usage: bool) -> AsyncIterator[str]:
    produced = 0
    finished = False
    try:
        if shape.chat:
            yield _sse_line(shape.chunk(None, None, first=True))
        while not finished:
            item = await stream.queue.get()
            # Tokens that piled up while this response was not scheduled go out in one chunk, as
            # vLLM's output processor does when the client is slower than the engine.
            items = [item]
            while not stream.queue.empty():
                items.append(stream.queue.get_nowait())
            text = []
            for it in items:
                if isinstance(it, str):
                    yield _sse_line({"error": {"message": it, "type": "InternalServerError", "param": None,
                                               "code": 500}})
                    yield "data: [DONE]\n\n"
                    return
                if it is None:
                    finished = True
                else:
                    text.append(tokens.output_word(shape.key, it))
                    produced += 1
            finish = (stream.sim.finish_reason or "length") if finished else None
            if text or finish:
                yield _sse_line(shape.chunk("".join(text), finish))
        if include_usage:
            last = shape.chunk(None, None)
            last["choices"] = []
            last["usage"] = shape.usage(produced)
            yield _sse_line(last)
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            engine.abort(stream)


async def _whole(engine: SimEngine, stream: Stream, shape: _Shape) -> Response:
    words: list[str] = []
    try:
        while True:
            item = await stream.queue.get()
            if isinstance(item, str):
                return ApiError(500, item, "InternalServerError").response()
            if item is None:
                break
            words.append(tokens.output_word(shape.key, item))
    except asyncio.CancelledError:
        engine.abort(stream)
        raise
    text = "".join(words)
    finish = stream.sim.finish_reason or "length"
    if shape.chat:
        choice: dict[str, object] = {"index": 0, "message": {"role": "assistant", "content": text},
                                     "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind, prefix = "text_completion", "cmpl-"
    return JSONResponse({"id": prefix + shape.id, "object": kind, "created": shape.created,
                         "model": shape.model, "choices": [choice], "usage": shape.usage(len(words))})


# --- process lifetime ------------------------------------------------------------------------------

async def _sleep_sim(seconds: float, speedup: float) -> None:
    await asyncio.sleep(seconds / speedup)


async def _start_engine(config: EngineConfig, log: VllmLog, workers: WorkerPool,
                        others: list[int]) -> tuple[MemoryPlan, EngineCore]:
    """vLLM's startup phases, with its log lines and memory as NVML sees it along the way."""
    speedup = config.sim.speedup
    tp = config.tensor_parallel_size
    pids = workers.pids
    log.core(f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model={config.model_arg!r}, "
             f"tensor_parallel_size={tp}, max_seq_len={config.max_model_len}, "
             f"enable_prefix_caching={config.enable_prefix_caching}, "
             f"chunked_prefill_enabled={config.enable_chunked_prefill}")
    if tp > 2 and config.sim.gpu.nvlink_gbps == 0:
        log.core("Custom allreduce is disabled because it's not supported on more than two PCIe-only "
                 "GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                 where="custom_all_reduce.py:144", level="WARNING")
    await asyncio.to_thread(workers.set_bytes, [CUDA_CONTEXT_BYTES] * tp)
    await _sleep_sim(INIT_S if tp > 1 else INIT_S / 2, speedup)
    try:
        plans = [plan_startup(config, used) for used in others]
    except StartupError as exc:
        if exc.phase in ("load", "profile"):
            await asyncio.to_thread(workers.set_bytes, [
                min(config.sim.gpu.memory_bytes - o, CUDA_CONTEXT_BYTES + config.model.weight_bytes // tp)
                for o in others])
        raise
    plan = plans[0]
    for p in plans[1:]:  # the engine takes the smallest KV cache over the workers
        if p.num_blocks < plan.num_blocks:
            plan = p
    if config.offload_backend != "none":
        offloader = "PrefetchOffloader" if config.offload_backend == "prefetch" else "UVAOffloader"
        log.worker(0, pids[0], f"Offloader set to {offloader}", where="base.py:139")
    for rank in range(tp):
        log.worker(rank, pids[rank], "Starting to load model " + config.model_arg + "...",
                   where="gpu_model_runner.py:2338")
    load_s = plan.weights_bytes / (LOAD_GBPS * 1e9) + 0.5
    await _sleep_sim(load_s, speedup)
    loaded = CUDA_CONTEXT_BYTES + plan.weights_bytes + plan.non_torch_bytes
    await asyncio.to_thread(workers.set_bytes, [loaded] * tp)
    if config.offload_bytes:
        log.worker(0, pids[0], f"Total CPU offloaded parameters: {gib(config.offload_bytes * tp)}",
                   where="utils.py:642")
    if config.prefetch_layers:
        for rank in range(tp):
            log.worker(rank, pids[rank], prefetch_init_line(config), where="prefetch.py:381")
    for rank in range(tp):
        log.worker(rank, pids[rank], f"Model loading took {gib(plan.weights_bytes)} GiB memory and "
                   f"{load_s:.6f} seconds", where="gpu_model_runner.py:2370")
    await asyncio.to_thread(workers.set_bytes, [loaded + plan.activation_peak_bytes] * tp)
    await _sleep_sim(PROFILE_S, speedup)
    if plan.cudagraph_bytes:
        log.worker(0, pids[0], f"Estimated CUDA graph memory: {gib(plan.cudagraph_bytes)} GiB total",
                   where="gpu_worker.py:298")
    for rank in range(tp):
        log.worker(rank, pids[rank], f"Available KV cache memory: {gib(plan.available_kv_bytes)} GiB",
                   where="gpu_worker.py:276")
    log.core(f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens, Maximum concurrency for "
             f"{config.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x",
             where="kv_cache_utils.py:1087")
    await asyncio.to_thread(workers.set_bytes, [loaded + plan.kv_cache_bytes] * tp)
    if not config.enforce_eager:
        await _sleep_sim(GRAPH_CAPTURE_S, speedup)
        log.worker(0, pids[0], f"Graph capturing finished in {GRAPH_CAPTURE_S:.0f} secs, took "
                   f"{gib(plan.cudagraph_bytes)} GiB", where="gpu_model_runner.py:3290")
    core = EngineCore(config, plan, others)
    await asyncio.to_thread(workers.set_bytes, core.memory_used())
    total_s = (INIT_S + load_s + PROFILE_S + (0 if config.enforce_eager else GRAPH_CAPTURE_S))
    log.core(f"init engine (profile, create kv cache, warmup model) took {total_s:.2f} seconds",
             where="core.py:218")
    return plan, core


async def _main(config: EngineConfig, log: VllmLog) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal() -> None:
        stopping.set()
        # vLLM's API server exits promptly on SIGTERM; ours must too, even if a worker pipe or an
        # executor thread hangs the orderly path (seen once under heavy load: the process lingered).
        watchdog = threading.Timer(SHUTDOWN_WATCHDOG_S, os._exit, args=(0,))
        watchdog.daemon = True
        watchdog.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    state_dir = state_dir_from_env()
    if config.sim.run is None:
        run = next_run(state_dir, config.sim.seed)
        config = dataclasses.replace(config, sim=dataclasses.replace(config.sim, run=run))
    host = GpuHost(state_dir)
    gpu = config.sim.gpu
    try:
        host.ensure_inventory(make_gpus(state_dir, gpu.product_name, gpu.memory_bytes, config.sim.num_gpus))
    except GpuInventoryConflict as exc:
        log.api(f"RuntimeError: {exc}", level="ERROR")
        return 1
    others = [host.used_bytes(i) for i in config.gpu_indices]
    log.api(f"vLLM API server version {VLLM_VERSION}", where="api_server.py:1839")
    log.api(f"Simulated GPUs: {config.sim.num_gpus}x {gpu.product_name} ({gpu.memory_gib} GiB), "
            f"speed-up {config.sim.speedup:g}, seed {config.sim.seed}, run {config.sim.run}, noise "
            f"{RunNoise.draw(config.sim.noise, config.sim.seed, config.sim.run or 0).describe()}", where="sim")
    log.api(f"Using max model len {config.max_model_len}", where="model.py:1520")
    if config.enable_chunked_prefill:
        log.api(f"Chunked prefill is enabled with max_num_batched_tokens={config.max_num_batched_tokens}.",
                where="scheduler.py:270")

    workers = WorkerPool(state_dir, list(config.gpu_indices))
    workers.start()
    try:
        startup = asyncio.ensure_future(_start_engine(config, log, workers, others))
        stop_wait = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({startup, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not startup.done():
            startup.cancel()
            with contextlib.suppress(asyncio.CancelledError, StartupError):
                await startup
            log.api("Shutting down during engine startup.")
            return 0
        stop_wait.cancel()
        try:
            _, core = startup.result()
        except StartupError as exc:
            log.core("EngineCore failed to start.", where="core.py:726", level="ERROR")
            log.core(exc.message, where="core.py:726", level="ERROR")
            log.api("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
                    "proc(s): {'EngineCore': 1}", level="ERROR")
            return 1
        return await _serve_http(config, log, workers, core, stopping)
    finally:
        await asyncio.to_thread(workers.stop)


async def _serve_http(config: EngineConfig, log: VllmLog, workers: WorkerPool, core: EngineCore,
                      stopping: asyncio.Event) -> int:
    engine = SimEngine(config, core, workers, log)
    app = build_app(config, engine, time.time())
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                               access_log=False, lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(uv_config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    log.api(f"Starting vLLM API server 0 on http://{config.host}:{config.port}", where="launcher.py:37")
    engine_task = asyncio.ensure_future(engine.run())
    server_task = asyncio.ensure_future(server.serve())
    stop_task = asyncio.ensure_future(stopping.wait())
    died_task = asyncio.ensure_future(engine.died.wait())
    await asyncio.wait({server_task, stop_task, died_task}, return_when=asyncio.FIRST_COMPLETED)
    if server_task.done() and not stop_task.done() and not died_task.done():
        # uvicorn could not bind (port taken): it logged why.
        exc = server_task.exception()
        engine_task.cancel()
        log.api(f"OSError: could not serve on {config.host}:{config.port}: {exc or 'bind failed'}",
                level="ERROR")
        return 1
    code = 0
    if died_task.done():
        await asyncio.sleep(DEATH_LINGER_S)
        code = 1
    else:
        log.api("Shutting down FastAPI HTTP server.", where="launcher.py:80")
    server.should_exit = True
    engine_task.cancel()
    for task in (stop_task, died_task):
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(server_task, timeout=3)
    with contextlib.suppress(asyncio.CancelledError):
        await engine_task
    return code


def serve(config: EngineConfig) -> int:
    log = VllmLog()
    try:
        import uvloop  # the simulated engine must keep pace with its scaled clock: the fast loop helps

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_main(config, log))
    except KeyboardInterrupt:
        return 0
