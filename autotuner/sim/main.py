"""`autotuner sim serve`'s process: a process that a vLLM client cannot tell from `vllm serve` on the
simulated GPUs.

Its lifetime, in the order vLLM's API server lives it: signals (SIGTERM/SIGINT stop it promptly, a
watchdog makes sure), the simulated GPU inventory, the TP worker processes (child processes holding
the simulated GPU memory, so NVML, `autotuner.sim.nvml`, sees it as it would see vLLM's), the startup
(`autotuner.sim.startup`), then the HTTP API (`autotuner.sim.api`) over the engine loop
(`autotuner.sim.engine_loop`) until stopped or the engine dies, and the exit code. The engine core
runs in scaled real time (simulated seconds / --sim-speedup).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
import time

import uvicorn

from autotuner.sim.api import build_app
from autotuner.sim.args import EngineConfig
from autotuner.sim.core import EngineCore
from autotuner.sim.engine_loop import SimEngine
from autotuner.sim.gpu_state import GpuHost, GpuInventoryConflict, make_gpus, state_dir_from_env
from autotuner.sim.memory import StartupError
from autotuner.sim.noise import next_run
from autotuner.sim.startup import log_banner, log_startup_failure, start_engine
from autotuner.sim.vllm_log import VllmLog
from autotuner.sim.worker_pool import WorkerPool

# After the engine dies, the API server lingers this long (wall) before exiting, as vLLM's does
# while it fails requests and tears down.
DEATH_LINGER_S = 0.5
SHUTDOWN_WATCHDOG_S = 8.0


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
    log_banner(config, log)

    workers = WorkerPool(state_dir, list(config.gpu_indices))
    workers.start()
    try:
        startup = asyncio.ensure_future(start_engine(config, log, workers, others))
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
            log_startup_failure(exc, log)
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
