"""How a simulated `vllm serve` starts: vLLM's startup phases, their log lines, and GPU memory as NVML
sees it along the way.

The API server's banner (`log_banner`), then the engine's phases in scaled time (`start_engine`):
CUDA contexts, the P2P check, weight loading, torch.compile, the profiling run, the KV cache, CUDA-graph
capture, each with the memory the TP workers hold at that point and the lines vLLM 0.32 logs, so a log
reader and a memory monitor see a real start. How long each phase takes, and what the host's caches
save, is `autotuner.sim.startup_time`'s. The sleeps are simulated seconds / the speed-up, further divided
by `$AUTOTUNER_SIM_STARTUP_COMPRESSION` (default 1): a test suite that starts hundreds of engines sets it
so that honest minutes of startup do not become minutes of wall time. A start that cannot fit raises
`StartupError` at vLLM's phase, and `log_startup_failure` writes what vLLM writes then. Separate from
the process main (`autotuner.sim.main`), which decides what happens around it.
"""

from __future__ import annotations

import asyncio
import os

from autotuner.sim.args import VLLM_VERSION, EngineConfig
from autotuner.sim.core import EngineCore
from autotuner.sim.memory import CUDA_CONTEXT_BYTES, MemoryPlan, StartupError, gib, plan_startup, prefetch_init_line
from autotuner.sim.noise import RunNoise
from autotuner.sim.startup_time import Phase, lookup_and_remember, phases
from autotuner.sim.vllm_log import VllmLog
from autotuner.sim.worker_pool import WorkerPool

STARTUP_COMPRESSION_ENV = "AUTOTUNER_SIM_STARTUP_COMPRESSION"


def startup_compression() -> float:
    raw = os.environ.get(STARTUP_COMPRESSION_ENV, "")
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        return 1.0
    return value if 1.0 <= value <= 1e6 else 1.0


def log_banner(config: EngineConfig, log: VllmLog) -> None:
    """The API server's first lines: its version, the simulated box, the length and prefill settings."""
    gpu = config.sim.gpu
    log.api(f"vLLM API server version {VLLM_VERSION}", where="api_server.py:1839")
    log.api(f"Simulated GPUs: {config.sim.num_gpus}x {gpu.product_name} ({gpu.memory_gib} GiB), "
            f"speed-up {config.sim.speedup:g}, seed {config.sim.seed}, run {config.sim.run}, noise "
            f"{RunNoise.draw(config.sim.noise, config.sim.seed, config.sim.run or 0).describe()}", where="sim")
    log.api(f"Using max model len {config.max_model_len}", where="model.py:1520")
    if config.enable_chunked_prefill:
        log.api(f"Chunked prefill is enabled with max_num_batched_tokens={config.max_num_batched_tokens}.",
                where="scheduler.py:270")


def log_startup_failure(exc: StartupError, log: VllmLog) -> None:
    log.core("EngineCore failed to start.", where="core.py:726", level="ERROR")
    log.core(exc.message, where="core.py:726", level="ERROR")
    log.api("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
            "proc(s): {'EngineCore': 1}", level="ERROR")


async def _sleep_sim(seconds: float, speedup: float) -> None:
    await asyncio.sleep(seconds / speedup / startup_compression())


def _phase(plan: list[Phase], name: str) -> Phase:
    return next((p for p in plan if p.name == name), Phase(name, 0.0, False))


async def start_engine(config: EngineConfig, log: VllmLog, workers: WorkerPool,
                       others: list[int]) -> tuple[MemoryPlan, EngineCore]:
    """vLLM's startup phases, with its log lines and memory as NVML sees it along the way."""
    speedup = config.sim.speedup
    tp = config.tensor_parallel_size
    pids = workers.pids
    weights_per_rank = max(0, config.model.weight_bytes // tp - config.freed_bytes)
    timeline = phases(config, await asyncio.to_thread(lookup_and_remember, workers.state_dir, config),
                      weights_per_rank)
    await _sleep_sim(_phase(timeline, "api-server").seconds, speedup)
    log.core(f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model={config.model_arg!r}, "
             f"tensor_parallel_size={tp}, max_seq_len={config.max_model_len}, "
             f"enable_prefix_caching={config.enable_prefix_caching}, "
             f"chunked_prefill_enabled={config.enable_chunked_prefill}")
    if tp > 2 and config.sim.gpu.nvlink_gbps == 0:
        log.core("Custom allreduce is disabled because it's not supported on more than two PCIe-only "
                 "GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                 where="custom_all_reduce.py:144", level="WARNING")
    await asyncio.to_thread(workers.set_bytes, [CUDA_CONTEXT_BYTES] * tp)
    for rank in range(tp):  # each worker names itself once its CUDA context exists, as vLLM's do
        log.worker(rank, pids[rank], f"rank {rank} in world size {tp} is assigned as DP rank 0, PP rank 0, "
                   f"TP rank {rank}, EP rank {rank}", where="parallel_state.py:1165")
    await _sleep_sim(_phase(timeline, "init").seconds, speedup)
    p2p = _phase(timeline, "p2p-check")
    if p2p.seconds:
        await _sleep_sim(p2p.seconds, speedup)
        log.core(f"generating GPU P2P access cache in ~/.cache/vllm/gpu_p2p_access_cache_for_"
                 f"{','.join(str(i) for i in config.gpu_indices)}.json (took {p2p.seconds:.1f} s)",
                 where="custom_all_reduce_utils.py:232")
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
    load_s = _phase(timeline, "load").seconds
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
    compile_s = _phase(timeline, "compile")
    if compile_s.seconds:
        await _sleep_sim(compile_s.seconds, speedup)
        if compile_s.cached:
            log.worker(0, pids[0], f"Directly load the compiled graph(s) for dynamic shape from the cache, "
                       f"took {compile_s.seconds:.3f} s", where="backends.py:161")
        log.worker(0, pids[0], f"torch.compile takes {compile_s.seconds:.2f} s in total", where="monitor.py:34")
    await asyncio.to_thread(workers.set_bytes, [loaded + plan.activation_peak_bytes] * tp)
    await _sleep_sim(_phase(timeline, "profile").seconds, speedup)
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
    graphs = _phase(timeline, "graphs")
    if graphs.seconds:
        await _sleep_sim(graphs.seconds, speedup)
        log.worker(0, pids[0], f"Graph capturing finished in {graphs.seconds:.0f} secs, took "
                   f"{gib(plan.cudagraph_bytes)} GiB", where="gpu_model_runner.py:3290")
    core = EngineCore(config, plan, others)
    await asyncio.to_thread(workers.set_bytes, core.memory_used())
    warmup_s = sum(p.seconds for p in timeline if p.name in ("compile", "profile", "graphs"))
    log.core(f"init engine (profile, create kv cache, warmup model) took {warmup_s:.2f} seconds",
             where="core.py:218")
    log.core(f"engine start took {sum(p.seconds for p in timeline):.2f} simulated seconds: " + ", ".join(
        f"{p.name} {p.seconds:.1f} s" + (" (cached)" if p.cached else "") for p in timeline), where="sim")
    return plan, core

