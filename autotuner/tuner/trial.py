"""One trial: one engine lifetime with one set of flags, measured.

start → wait ready (fail fast) → warm up → replay the workload while sampling memory (stop the engine
within one sample period if the OOM threshold trips) and polling /metrics → stop the whole process
group → wait until memory is back near where it was. Every candidate failure is an outcome of the
result; only bad input (scenario, busy GPUs we must not touch) raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import structlog

from autotuner.engine import classify as oc
from autotuner.engine.launch import LaunchPlan, plan_launch
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.errors import InfrastructureError
from autotuner.monitor import MemoryMonitor, MemorySummary, Sampler, Threshold, ThresholdEvent, open_monitor
from autotuner.monitor.checks import busy_devices, wait_for_release
from autotuner.scenario import FlagValue, Scenario
from autotuner.sim.gpu_state import GpuHost, GpuInventoryConflict, make_gpus, state_dir_from_env
from autotuner.sim.hardware import load_gpu
from autotuner.workload import prometheus
from autotuner.workload.client import StreamingClient, http_client, shard_count
from autotuner.workload.replay import Replayer
from autotuner.workload.requests import build_requests
from autotuner.workload.summary import summarize

log = structlog.get_logger(__name__)

# Memory within this much of the pre-launch level counts as released.
RELEASE_TOLERANCE_BYTES = 256 << 20
# /metrics polling during the replay, for the KV-cache usage peak (wall seconds).
METRICS_POLL_S = 0.5
TIMELINE_POINTS = 300

Phase = Callable[[str], None]


class GpusBusyError(InfrastructureError):
    """GPUs we were asked to use hold memory of processes that are not ours."""


@dataclass
class TrialResult:
    outcome: str
    reason: str | None
    flags: dict[str, FlagValue]
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    startup_s: float | None = None
    metrics: dict[str, float | int | None] = field(default_factory=dict)
    memory: dict[str, object] = field(default_factory=dict)
    engine: dict[str, object] = field(default_factory=dict)
    time_scale: float = 1.0
    infrastructure: bool = False
    log_tail: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.outcome == oc.OK

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def threshold_of(scenario: Scenario) -> Threshold:
    t = scenario.oom_threshold
    return Threshold(fraction=t.fraction, min_free_mib=t.min_free_mib)


def monitor_for(scenario: Scenario, root_pid: Callable[[], int | None] | None = None) -> MemoryMonitor:
    kind = scenario.monitor.kind
    if scenario.engine.kind == "sim":
        ensure_sim_gpus(scenario)
        kind = "sim" if kind == "auto" else kind
    return open_monitor(kind, scenario.engine.gpus, root_pid=root_pid)


def ensure_sim_gpus(scenario: Scenario) -> None:
    """The simulated box exists before its first engine starts, so it can be watched (and checked for
    busy GPUs) like a real one."""
    gpu = load_gpu(scenario.sim_gpu())
    count = scenario.sim_gpu_count()
    state = state_dir_from_env()
    host = GpuHost(state)
    try:
        host.ensure_inventory(make_gpus(state, gpu.product_name, gpu.memory_bytes, count))
    except GpuInventoryConflict as exc:
        raise GpusBusyError(f"simulated GPUs in {state}: {exc}") from None


class _Engine:
    """Holds the current engine so the monitor (host RSS) and the threshold callback can reach it."""

    def __init__(self) -> None:
        self.process: EngineProcess | None = None

    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid_or_none


async def measure(
    scenario: Scenario,
    candidate: Mapping[str, FlagValue],
    *,
    log_dir: Path,
    registry: EngineRegistry | None = None,
    on_phase: Phase | None = None,
    port: int | None = None,
) -> TrialResult:
    """Measure `candidate` (flags on top of the scenario's fixed ones). Raises UserInputError for bad
    input and GpusBusyError when the GPUs are not free; every other failure is in the result."""
    phase = on_phase or (lambda _p: None)
    registry = registry or EngineRegistry()
    plan = plan_launch(scenario, candidate, port=port)
    holder = _Engine()
    monitor = monitor_for(scenario, holder.pid)
    try:
        reaped = registry.reap_orphans()
        if reaped:
            log.warning("engine.orphans_stopped", process_groups=reaped)
        if scenario.monitor.kind != "host":
            busy = await _wait_not_busy(monitor, scenario.engine.release_timeout_s if reaped else 0.0)
            if busy:
                raise GpusBusyError(_busy_message(monitor, busy))
        return await _run(scenario, plan, monitor, holder, registry, log_dir, phase)
    finally:
        monitor.close()


async def _wait_not_busy(monitor: MemoryMonitor, timeout_s: float) -> dict[int, list[tuple[int, int]]]:
    """Busy devices, after waiting up to `timeout_s` for memory of just-stopped engines to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = busy_devices(monitor)
        if not busy or time.monotonic() >= deadline:
            return busy
        await asyncio.sleep(0.1)


def _busy_message(monitor: MemoryMonitor, busy: dict[int, list[tuple[int, int]]]) -> str:
    parts = []
    for index, procs in sorted(busy.items()):
        held = ", ".join(f"pid {pid} holds {b / 2**30:.1f} GiB" for pid, b in procs)
        parts.append(f"GPU {index}: {held}")
    return ("GPUs busy — " + "; ".join(parts) + ". Stop those processes or pick other GPUs with "
            "engine.gpus; autotuner never kills processes it did not start.")


async def _run(scenario: Scenario, plan: LaunchPlan, monitor: MemoryMonitor, holder: _Engine,
               registry: EngineRegistry, log_dir: Path, phase: Phase) -> TrialResult:
    t_begin = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{plan.port}.log"
    result = TrialResult(oc.OK, None, dict(plan.flags), _redact_argv(plan.argv), plan.redacted_env())
    result.engine["log_path"] = str(log_path)

    loop = asyncio.get_running_loop()
    tripped = asyncio.Event()
    engine = EngineProcess(plan.argv, plan.env, log_path, registry)
    holder.process = engine

    def on_threshold(event: ThresholdEvent) -> None:
        # Sampler thread: kill at once (within one sample period), then wake the measuring task.
        engine.kill_now()
        loop.call_soon_threadsafe(tripped.set)

    sampler = Sampler(monitor, hz=scenario.monitor.hz, threshold=threshold_of(scenario),
                      on_threshold=on_threshold, max_points=TIMELINE_POINTS)
    baseline = monitor.sample()
    phase("starting")
    engine.start()
    sampler.start()
    summary: MemorySummary | None = None
    try:
        t_start = time.monotonic()
        why = await _race(engine.wait_ready(plan.base_url, plan.served_name, scenario.engine.startup_timeout_s,
                                            plan.headers()), tripped)
        result.startup_s = time.monotonic() - t_start
        if why is not None or tripped.is_set():
            _startup_outcome(result, engine, why, tripped.is_set())
        else:
            await _serve_and_replay(scenario, plan, engine, result, tripped, phase)
    finally:
        phase("stopping")
        engine.stop(grace_s=scenario.engine.stop_grace_s)
        with contextlib.suppress(Exception):
            summary = sampler.stop()
        holder.process = None
    _finish(result, engine, summary, tripped.is_set())
    released = await asyncio.to_thread(wait_for_release, monitor, baseline, RELEASE_TOLERANCE_BYTES,
                                       scenario.engine.release_timeout_s)
    if not released:
        result.warnings.append(f"GPU memory not back to its pre-launch level within "
                               f"{scenario.engine.release_timeout_s:g} s after the engine stopped")
    result.duration_s = time.monotonic() - t_begin
    log.info("trial.measured", outcome=result.outcome, reason=result.reason, flags=result.flags,
             output_tokens_per_s=result.metrics.get("output_tokens_per_s"),
             ttft_p95_s=result.metrics.get("ttft_p95_s"), peak_fraction=result.memory.get("peak_fraction"))
    return result


async def _race(coro: object, tripped: asyncio.Event) -> str | None:
    """Run `coro` unless the OOM threshold trips first."""
    task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    trip = asyncio.ensure_future(tripped.wait())
    await asyncio.wait({task, trip}, return_when=asyncio.FIRST_COMPLETED)
    trip.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return "threshold"
    return task.result()


def _startup_outcome(result: TrialResult, engine: EngineProcess, why: str | None, tripped: bool) -> None:
    if tripped:
        result.outcome, result.reason = oc.OOM_THRESHOLD, "memory crossed the OOM threshold during startup"
        return
    if why == "timeout":
        result.outcome = oc.TIMEOUT
        result.reason = "engine not ready within engine.startup_timeout_s"
        return
    # It exited: the log says why. Read it to the end first (children write after the leader exits).
    engine.stop(grace_s=1.0)
    facts = engine.facts
    result.outcome = facts.failure or oc.CRASH
    result.reason = facts.reason or f"engine exited with code {engine.returncode} during startup"
    if result.outcome == oc.CRASH and facts.reason and "Address already in use" in facts.reason:
        result.infrastructure = True


async def _serve_and_replay(scenario: Scenario, plan: LaunchPlan, engine: EngineProcess, result: TrialResult,
                            tripped: asyncio.Event, phase: Phase) -> None:
    api_key = plan.env.get("VLLM_API_KEY")
    async with http_client() as http, contextlib.AsyncExitStack() as shards:
        time_scale = await _time_scale(http, plan.base_url)
        result.time_scale = time_scale
        spec = scenario.workload.to_spec(scenario.source.parent if scenario.source else None, time_scale)
        phase("warm-up")
        request_set = await build_requests(spec, http, plan.base_url, plan.served_name, api_key)
        result.warnings += request_set.warnings
        extra = [await shards.enter_async_context(http_client())
                 for _ in range(shard_count(_peak_concurrency(scenario)) - 1)]
        client = StreamingClient(http, plan.base_url, plan.served_name, api_key, ignore_eos=spec.ignore_eos,
                                 timeout_s=spec.request_timeout_s, extra=extra)
        before = await _scrape(http, plan.base_url)
        replayer = Replayer(spec, request_set.requests, client)
        stop_poll = asyncio.Event()
        snapshots: list[prometheus.Snapshot] = []
        poller = asyncio.ensure_future(prometheus.poll(http, plan.base_url, METRICS_POLL_S, stop_poll, snapshots))
        phase("replay")
        run = asyncio.ensure_future(replayer.run())
        died = asyncio.ensure_future(_watch_exit(engine))
        trip = asyncio.ensure_future(tripped.wait())
        await asyncio.wait({run, died, trip}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        for task in (died, trip):
            task.cancel()
        replay = replayer.result()
        after = await _scrape(http, plan.base_url)
        stop_poll.set()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    result.metrics = summarize(replay.results, replay.duration_s, time_scale)
    if before is not None and after is not None:
        d = prometheus.delta(before, after)
        result.engine["preemptions"] = int(d.preemptions)
    kv_peak = prometheus.peak([s for s in (before, *snapshots, after) if s is not None])
    result.engine["kv_cache_usage_max"] = kv_peak
    failed = [r for r in replay.results if not r.ok]
    if failed and not result.reason:
        result.reason = f"{len(failed)} request(s) failed, first: {failed[0].error}"


def _peak_concurrency(scenario: Scenario) -> int:
    """Streams the replay may hold open at once (open-loop arrivals: a guess from the request count)."""
    arrivals = scenario.workload.arrivals
    if arrivals.kind == "concurrency":
        return arrivals.concurrency
    if arrivals.kind == "burst" and arrivals.burst_size:
        return arrivals.burst_size
    return min(scenario.workload.requests.count, 64)


async def _watch_exit(engine: EngineProcess) -> None:
    """Returns when the engine exits or its log says it died (a CUDA OOM can leave vLLM hanging)."""
    while engine.returncode is None and not engine.facts.fatal:
        await asyncio.sleep(0.05)


async def _scrape(http: httpx.AsyncClient, base_url: str) -> prometheus.Snapshot | None:
    try:
        return await prometheus.scrape(http, base_url)
    except prometheus.ScrapeError:
        return None


async def _time_scale(http: httpx.AsyncClient, base_url: str) -> float:
    """The simulator says how much faster than its simulated hardware it runs; a real engine is 1."""
    try:
        body = (await http.get(base_url + "/version", timeout=5)).json()
    except (httpx.HTTPError, ValueError):
        return 1.0
    sim = body.get("simulator") if isinstance(body, dict) else None
    return float(sim.get("speedup", 1.0)) if isinstance(sim, dict) else 1.0


def _finish(result: TrialResult, engine: EngineProcess, summary: MemorySummary | None, tripped: bool) -> None:
    facts = engine.facts
    result.engine.update(version=facts.version, kv_cache_tokens=facts.kv_cache_tokens,
                         model_load_gib=facts.model_load_gib, max_num_batched_tokens=facts.max_num_batched_tokens)
    result.engine.setdefault("preemptions", None)
    result.engine.setdefault("kv_cache_usage_max", None)
    if summary is not None:
        result.memory = {
            "peak_bytes": summary.peak_bytes,
            "total_bytes": summary.total_bytes,
            "baseline_bytes": summary.baseline_bytes,
            "peak_fraction": summary.peak_fraction,
            "samples": summary.samples,
            "sample_hz": summary.sample_hz,
            "devices": [d.index for d in summary.devices],
            "timeline": [[round(t, 4), list(v)] for t, v in summary.timeline],
        }
    result.log_tail = engine.log_tail(40)
    if tripped:
        event = summary.threshold_event if summary is not None else None
        result.outcome = oc.OOM_THRESHOLD
        result.reason = (f"GPU {event.index} reached {event.used_bytes / 2**30:.2f} GiB of "
                         f"{event.total_bytes / 2**30:.2f} GiB (threshold {event.limit_bytes / 2**30:.2f} GiB)"
                         if event is not None else "memory crossed the OOM threshold")
        return
    if result.outcome != oc.OK:
        return
    if facts.failure is not None and facts.failure_after_ready:
        result.outcome, result.reason = facts.failure, facts.reason
    elif engine.returncode not in (None, 0) and not engine.stopping:
        result.outcome = oc.CRASH
        result.reason = result.reason or f"engine exited with code {engine.returncode} while serving"


def _redact_argv(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, part in enumerate(out[:-1]):
        if part == "--api-key":
            out[i + 1] = "***"
    return out
