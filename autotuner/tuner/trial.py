"""One trial: one engine lifetime with one set of flags, measured.

start → wait ready (fail fast) → warm up → replay the workload while sampling memory (stop the engine
within one sample period if the OOM threshold trips) and polling /metrics → stop the whole process
group → wait until memory is back near where it was. Every candidate failure is an outcome of the
result; only bad input (scenario, busy GPUs we must not touch) raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx
import structlog

from autotuner.backends import backend_for
from autotuner.catalog.gpus import load_gpu
from autotuner.engine import classify as oc
from autotuner.engine.gpu_locks import GpuLocks, GpusBusyError
from autotuner.engine.launch import LaunchPlan, plan_launch
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.monitor import (
    HostMonitor,
    MemoryMonitor,
    MemorySummary,
    MonitorError,
    Sampler,
    Threshold,
    ThresholdEvent,
    open_monitor,
)
from autotuner.monitor.checks import wait_for_release
from autotuner.monitor.foreign import (
    INTERFERENCE_BYTES,
    MIB,
    ForeignMemory,
    foreign_baseline,
    foreign_processes,
    unlisted_warning,
)
from autotuner.scenario import Scenario
from autotuner.sim.gpu_state import GpuHost, GpuInventoryConflict, make_gpus, state_dir_from_env
from autotuner.tuner import pruning
from autotuner.vllm import FlagValue
from autotuner.workload import prometheus
from autotuner.workload.client import StreamingClient, http_client, shard_count
from autotuner.workload.replay import CANCELLED, Replayer
from autotuner.workload.requests import build_requests
from autotuner.workload.summary import summarize

log = structlog.get_logger(__name__)

# Memory within this much of the pre-launch level counts as released.
RELEASE_TOLERANCE_BYTES = 256 << 20
# /metrics polling during the replay, for the KV-cache usage peak (wall seconds).
METRICS_POLL_S = 0.5  # of engine time: a simulator at speed-up N is polled N times as often (down to the floor)
METRICS_POLL_FLOOR_S = 0.1
TIMELINE_POINTS = 300
# How often the trial looks for other processes' memory growing on its GPUs, and records the engine's
# processes (so a later run can stop exactly those if this tuner dies).
WATCH_S = 0.5
# A trial refused because the GPUs are taken (never launched, the study stops with the message).
GPUS_BUSY = "gpus-busy"

Phase = Callable[[str], None]

__all__ = ["GPUS_BUSY", "GpusBusyError", "TrialResult", "measure"]


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
    backend = backend_for(scenario)
    backend.prepare_gpus(scenario)
    kind = backend.monitor_kind(scenario.monitor.kind)
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


class GpuHeadroom(NamedTuple):
    """The engine's GPUs now: memory of each, and the largest foreign baseline among them."""

    total_bytes: int
    foreign_bytes: int


def gpu_headroom(scenario: Scenario, registry: EngineRegistry | None = None) -> GpuHeadroom | None:
    """What other processes hold on the scenario's GPUs before tuning, for the search space's
    utilization bound; None where the memory wall is not a GPU's (host monitor, virtual time).
    Orphans of an earlier run of ours are stopped first: their memory is not a stranger's."""
    if not backend_for(scenario).uses_box_gpus or scenario.monitor.kind == "host":
        return None
    registry = registry or EngineRegistry()
    with monitor_for(scenario) as monitor:
        if isinstance(monitor, HostMonitor):
            return None
        # Another tuner on these GPUs: say so now, not after the space was fitted around its engine.
        with GpuLocks([(d.index, d.uuid) for d in monitor.devices()]):
            registry.reap_orphans()
            ours = registry.recently_stopped()
            baseline = foreign_baseline(monitor, ours.__contains__)
        total = min(d.total_bytes for d in monitor.devices())
    return GpuHeadroom(total, max((f.bytes for f in baseline), default=0))


@contextlib.contextmanager
def hold_gpus(scenario: Scenario) -> Iterator[None]:
    """Keep the scenario's GPUs locked against other autotuners for a whole study (between trials
    too); each trial takes the same locks again (re-entrant in this process)."""
    if not backend_for(scenario).uses_box_gpus or scenario.monitor.kind == "host":
        yield
        return
    with monitor_for(scenario) as monitor:
        devices = [] if isinstance(monitor, HostMonitor) else [(d.index, d.uuid) for d in monitor.devices()]
    with GpuLocks(devices):
        yield


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
    monitor: MemoryMonitor | None = None,
) -> TrialResult:
    """Measure `candidate` (flags on top of the scenario's fixed ones). Raises UserInputError for bad
    input and GpusBusyError when the GPUs are not free; every other failure is in the result.
    `monitor` replaces the scenario's (it is closed here too)."""
    phase = on_phase or (lambda _p: None)
    registry = registry or EngineRegistry()
    plan = plan_launch(scenario, candidate, port=port)
    holder = _Engine()
    monitor = monitor or monitor_for(scenario, holder.pid)
    locks: GpuLocks | None = None
    try:
        foreign: list[ForeignMemory] = []
        if not isinstance(monitor, HostMonitor):
            # Held from the check until our engine has stopped and its memory is back (in _run).
            locks = GpuLocks([(d.index, d.uuid) for d in monitor.devices()], engine=True)
            locks.acquire()
        reaped = registry.reap_orphans()
        if reaped:
            log.warning("engine.orphans_stopped", process_groups=reaped)
        if locks is not None:
            foreign = await _foreign_within_allowance(scenario, monitor, registry, bool(reaped))
        return await _run(scenario, plan, monitor, holder, registry, log_dir, phase, foreign)
    finally:
        monitor.close()
        if locks is not None:
            locks.release()


async def _foreign_within_allowance(scenario: Scenario, monitor: MemoryMonitor, registry: EngineRegistry,
                                    reaped: bool) -> list[ForeignMemory]:
    """The foreign baseline per GPU, once within the allowance. Memory of our own engines that were
    just stopped (or killed) is on its way out: wait for it, bounded; a stranger's is refused at once."""
    allowance = scenario.monitor.foreign_allowance_mib * MIB
    deadline = time.monotonic() + scenario.engine.release_timeout_s
    while True:
        ours = registry.recently_stopped()
        baseline = await asyncio.to_thread(foreign_baseline, monitor, ours.__contains__)
        over = [f for f in baseline if f.bytes > allowance]
        ours_left = bool(ours) and await asyncio.to_thread(_still_holding, monitor, ours)
        if not over and not ours_left:
            break
        exiting = reaped or ours_left or any(_zombie(p.pid) for f in over for p in f.processes)
        if not exiting or time.monotonic() >= deadline:
            if over:
                raise GpusBusyError(_busy_message(over, scenario.monitor.foreign_allowance_mib))
            break
        await asyncio.sleep(0.1)
    warning = unlisted_warning(baseline)
    if warning:
        log.warning("gpu.foreign_unlisted", warning=warning)
    held = [f for f in baseline if f.bytes]
    if held:
        log.info("gpu.foreign_baseline", gpus=[f.text() for f in held])
    return baseline


def _still_holding(monitor: MemoryMonitor, pids: set[int]) -> bool:
    return any(pid in pids for position in range(len(monitor.devices())) for pid, _ in monitor.processes(position))


def _zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _busy_message(over: list[ForeignMemory], allowance_mib: int) -> str:
    parts = "; ".join(f.text() for f in over)
    need = max(f.bytes for f in over) / MIB
    return (f"GPUs busy — {parts}: more than monitor.foreign_allowance_mib = {allowance_mib} MiB of other "
            f"processes' memory. Stop those processes, pick other GPUs with engine.gpus, or raise "
            f"monitor.foreign_allowance_mib to at least {need:.0f} if they stay (the tuner then budgets "
            "around them); autotuner never kills processes it did not start.")


class _Abort:
    """Why a trial must stop early for reasons that are not the candidate's (set from the watcher)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.outcome: str | None = None
        self.reason: str | None = None

    def set(self, outcome: str, reason: str) -> None:
        if not self.event.is_set():
            self.outcome, self.reason = outcome, reason
            self.event.set()


async def _run(scenario: Scenario, plan: LaunchPlan, monitor: MemoryMonitor, holder: _Engine,
               registry: EngineRegistry, log_dir: Path, phase: Phase, foreign: list[ForeignMemory]) -> TrialResult:
    t_begin = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{plan.port}.log"
    result = TrialResult(oc.OK, None, dict(plan.flags), _redact_argv(plan.argv), plan.redacted_env())
    result.engine["log_path"] = str(log_path)
    warning = unlisted_warning(foreign)
    if warning:
        result.warnings.append(warning)

    loop = asyncio.get_running_loop()
    tripped = asyncio.Event()
    abort = _Abort()
    engine = EngineProcess(plan.argv, plan.env, log_path, registry)

    def on_threshold(event: ThresholdEvent) -> None:
        # Sampler thread: kill at once (within one sample period), then wake the measuring task.
        engine.kill_now()
        loop.call_soon_threadsafe(tripped.set)

    sampler = Sampler(monitor, hz=scenario.monitor.hz, threshold=threshold_of(scenario),
                      on_threshold=on_threshold, max_points=TIMELINE_POINTS)
    try:
        baseline = monitor.sample()
    except MonitorError as exc:
        return _monitor_failed(result, f"memory could not be read before launch: {exc}", t_begin)
    summary: MemorySummary | None = None
    monitor_error: str | None = None
    watcher: asyncio.Future[None] | None = None
    phase("starting")
    try:
        # From here on, whatever happens (the first sample fails, the registry cannot be written, the
        # task is cancelled), the finally below stops the engine.
        holder.process = engine
        engine.start()
        sampler.start()
        watcher = asyncio.ensure_future(_watch(engine, sampler, monitor, foreign, abort))
        t_start = time.monotonic()
        why = await _race(engine.wait_ready(plan.base_url, plan.served_name, scenario.engine.startup_timeout_s,
                                            plan.headers()), tripped, abort.event)
        result.startup_s = time.monotonic() - t_start
        if why is not None or tripped.is_set():
            if not abort.event.is_set():
                _startup_outcome(result, engine, why, tripped.is_set())
        else:
            engine.record_members()
            await _serve_and_replay(scenario, plan, engine, result, tripped, abort.event, phase)
    except MonitorError as exc:
        monitor_error = str(exc)
    finally:
        phase("stopping")
        await _cancel(watcher)
        engine.stop(grace_s=scenario.engine.stop_grace_s)
        if sampler.running:
            try:
                summary = sampler.stop()
            except MonitorError as exc:
                monitor_error = str(exc)
        holder.process = None
    _finish(result, engine, summary, tripped.is_set())
    _foreign_record(result, foreign, summary)
    grown = await asyncio.to_thread(_foreign_growth, monitor, foreign, engine)
    if grown is not None:
        abort.set(oc.INTERFERENCE, grown)
    if abort.outcome is not None and abort.reason is not None:
        result.outcome, result.reason, result.infrastructure = abort.outcome, abort.reason, True
        result.metrics = {}
    elif (monitor_error is not None or summary is None) and result.outcome in (oc.OK, oc.CRASH, oc.TIMEOUT):
        _monitor_failed(result, f"no memory evidence: {monitor_error or 'the sampler did not run'}")
    try:
        released = await asyncio.to_thread(wait_for_release, monitor, baseline, RELEASE_TOLERANCE_BYTES,
                                           scenario.engine.release_timeout_s)
    except MonitorError as exc:
        released = True  # nothing to wait on; said below
        result.warnings.append(f"GPU memory release could not be checked: {exc}")
        if result.outcome == oc.OK:  # a feasible claim needs the whole run watched
            _monitor_failed(result, f"memory could not be read after the trial: {exc}")
    if not released:
        result.warnings.append(f"GPU memory not back to its pre-launch level within "
                               f"{scenario.engine.release_timeout_s:g} s after the engine stopped")
    result.duration_s = time.monotonic() - t_begin
    log.info("trial.measured", outcome=result.outcome, reason=result.reason, flags=result.flags,
             output_tokens_per_s=result.metrics.get("output_tokens_per_s"),
             ttft_p95_s=result.metrics.get("ttft_p95_s"), peak_fraction=result.memory.get("peak_fraction"),
             foreign_mib=[round(f.bytes / MIB) for f in foreign])
    return result


def _monitor_failed(result: TrialResult, reason: str, t_begin: float | None = None) -> TrialResult:
    """No memory evidence: a machine fault (retried), never feasible."""
    result.outcome, result.reason, result.infrastructure = oc.MONITOR_FAILED, reason, True
    result.metrics = {}
    if t_begin is not None:
        result.duration_s = time.monotonic() - t_begin
    return result


def _foreign_record(result: TrialResult, foreign: list[ForeignMemory], summary: MemorySummary | None) -> None:
    """The foreign baseline beside the device-level figures, and our engine's own peak without it."""
    if not foreign:
        return
    result.memory["foreign"] = [f.to_dict() for f in foreign]
    result.memory["foreign_bytes"] = [f.bytes for f in foreign]
    if summary is not None and len(summary.peak_bytes) == len(foreign):
        result.memory["engine_peak_bytes"] = [max(0, p - f.bytes)
                                              for p, f in zip(summary.peak_bytes, foreign, strict=True)]


def _is_ours(engine: EngineProcess) -> Callable[[int], bool]:
    known = engine.known_pids
    leader = engine.pid_or_none

    def ours(pid: int) -> bool:
        if pid in known:
            return True
        try:
            return leader is not None and os.getpgid(pid) == leader
        except OSError:
            return False

    return ours


def _foreign_growth(monitor: MemoryMonitor, foreign: list[ForeignMemory], engine: EngineProcess) -> str | None:
    """Other processes' memory that grew since the baseline, as a reason; None if none did (or if
    NVML names no holder at all, as in a container: then growth cannot be told from ours)."""
    if not foreign:
        return None
    ours = _is_ours(engine)
    grown = []
    for position, before in enumerate(foreign):
        if before.unlisted:
            continue
        try:
            now = foreign_processes(monitor, position, ours)
        except MonitorError:
            return None
        added = sum(p.bytes for p in now) - sum(p.bytes for p in before.processes)
        if added > INTERFERENCE_BYTES:
            new = [p for p in now if p not in before.processes]
            names = ", ".join(p.text() for p in new) or "processes already there"
            grown.append(f"GPU {before.index}: other processes' memory grew by {added / MIB:.0f} MiB ({names})")
    if not grown:
        return None
    return ("; ".join(grown) + " during the trial — not the candidate's fault; the trial is run again once "
            "that memory is gone")


async def _watch(engine: EngineProcess, sampler: Sampler, monitor: MemoryMonitor, foreign: list[ForeignMemory],
                 abort: _Abort) -> None:
    """While the engine lives: stop the trial if the sampler dies (nobody watches the OOM wall) or
    other processes take memory on our GPUs; keep the engine's processes on record."""
    while True:
        await asyncio.sleep(WATCH_S)
        if sampler.failure is not None:
            abort.set(oc.MONITOR_FAILED, f"memory sampling failed during the trial: {sampler.failure}")
            return
        await asyncio.to_thread(engine.record_members)
        grown = await asyncio.to_thread(_foreign_growth, monitor, foreign, engine)
        if grown is not None:
            abort.set(oc.INTERFERENCE, grown)
            return


async def _cancel(*tasks: asyncio.Future[object] | None) -> None:
    """Cancel and await: nothing of a trial outlives it, on any path."""
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _race(coro: object, *events: asyncio.Event) -> str | None:
    """Run `coro` unless one of `events` is set first ("threshold": stopped early)."""
    task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait({task, *waits}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancel(*waits)
        if not task.done():
            await _cancel(task)
    if task.cancelled():
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
                            tripped: asyncio.Event, aborted: asyncio.Event, phase: Phase) -> None:
    api_key = plan.env.get("VLLM_API_KEY")
    async with http_client() as http, contextlib.AsyncExitStack() as shards:
        time_scale = await _time_scale(http, plan.base_url)
        result.time_scale = time_scale
        spec = scenario.workload.to_spec(scenario.source.parent if scenario.source else None, time_scale)
        phase("warm-up")
        request_set = await build_requests(spec, http, plan.base_url, plan.served_name, api_key)
        result.warnings += request_set.warnings
        extra = [await shards.enter_async_context(http_client())
                 for _ in range(shard_count(peak_concurrency(scenario)) - 1)]
        client = StreamingClient(http, plan.base_url, plan.served_name, api_key, ignore_eos=spec.ignore_eos,
                                 timeout_s=spec.request_timeout_s, extra=extra)
        before = await _scrape(http, plan.base_url)
        replayer = Replayer(spec, request_set.requests, client)
        stop_poll = asyncio.Event()
        snapshots: list[prometheus.Snapshot] = []
        # KV usage is a gauge: its peak is seen only if a scrape lands while the run is busy, and a sped-up
        # simulator's whole replay can be shorter than one engine-time interval.
        poll_s = max(METRICS_POLL_S / time_scale, METRICS_POLL_FLOOR_S)
        poller = asyncio.ensure_future(prometheus.poll(http, plan.base_url, poll_s, stop_poll, snapshots))
        run = died = trip = stop = prune = None
        pruned: str | None = None
        try:
            phase("replay")
            run = asyncio.ensure_future(replayer.run())
            died = asyncio.ensure_future(_watch_exit(engine))
            trip = asyncio.ensure_future(tripped.wait())
            stop = asyncio.ensure_future(aborted.wait())
            pruner = pruning.judge.get()
            prune = asyncio.ensure_future(pruning.watch(replayer, pruner)) if pruner is not None else None
            await asyncio.wait({run, died, trip, stop, *([prune] if prune else [])},
                               return_when=asyncio.FIRST_COMPLETED)
            pruned = prune.result() if prune is not None and prune.done() and not prune.cancelled() else None
            await _cancel(run, died, trip, stop, prune)
            replay = replayer.result()
            after = await _scrape(http, plan.base_url)
            stop_poll.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(poller), timeout=5)
        finally:
            # Also when we are cancelled: no replay, poll or watch task outlives the trial.
            await _cancel(run, died, trip, stop, prune, poller)
    results = replay.results
    if pruned is not None:
        # Stopped on purpose: the requests cut short are not failures of the configuration.
        results = [r for r in results if r.error != CANCELLED]
        result.outcome, result.reason = oc.PRUNED, pruned
    result.metrics = summarize(results, replay.duration_s, time_scale)
    if pruned is not None:
        result.metrics["partial_of"] = len(replay.results) + replay.not_sent
    if before is not None and after is not None:
        d = prometheus.delta(before, after)
        result.engine["preemptions"] = int(d.preemptions)
    kv_peak = prometheus.peak([s for s in (before, *snapshots, after) if s is not None])
    result.engine["kv_cache_usage_max"] = kv_peak
    failed = [r for r in results if not r.ok]
    if failed and not result.reason:
        result.reason = f"{len(failed)} request(s) failed, first: {failed[0].error}"


def peak_concurrency(scenario: Scenario) -> int:
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
