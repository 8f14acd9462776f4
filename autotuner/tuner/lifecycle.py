"""One trial: one engine lifetime with one set of flags, measured.

start → wait ready (fail fast) → warm up → replay the workload while sampling memory (stop the engine
within one sample period if the OOM threshold trips) and polling /metrics → stop the whole process
group → wait until memory is back near where it was. `measure_lifetime` replays the workload several
times on the one engine (confirmation's repeats within a lifetime): each replay is a result of its own,
all of them carry the lifetime's memory peak, and a lifetime that ends in a failure fails each of them.
Every candidate failure is an outcome of the result; only bad input (scenario, busy GPUs we must not
touch) raises. The GPU checks around the lifetime are gpu_guard.py's, the measured phase replay_phase.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import structlog

from autotuner.backends import backend_for
from autotuner.engine.gpu_locks import GpuLocks
from autotuner.engine.launch import LaunchPlan, plan_launch
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.monitor import (
    HostMonitor,
    MemoryMonitor,
    MemorySummary,
    MonitorError,
    Sampler,
    ThresholdEvent,
)
from autotuner.monitor.checks import wait_for_release
from autotuner.monitor.foreign import MIB, ForeignMemory, unlisted_warning
from autotuner.private_files import private_dir
from autotuner.scenario import Scenario
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import Phase, TrialResult
from autotuner.trials.scoring import threshold_of
from autotuner.tuner.gpu_guard import foreign_growth, foreign_within_allowance
from autotuner.tuner.pruning import Pruner
from autotuner.tuner.replay_phase import serve_and_replay
from autotuner.tuner.trial_tasks import cancel, race
from autotuner.vllm import FlagValue

log = structlog.get_logger(__name__)

# Memory within this much of the pre-launch level counts as released.
RELEASE_TOLERANCE_BYTES = 256 << 20
TIMELINE_POINTS = 300
# How often the trial looks for other processes' memory growing on its GPUs, and records the engine's
# processes (so a later run can stop exactly those if this tuner dies).
WATCH_S = 0.5


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
    pruner: Pruner | None = None,
) -> TrialResult:
    """Measure `candidate` (flags on top of the scenario's fixed ones). Raises UserInputError for bad
    input and GpusBusyError when the GPUs are not free; every other failure is in the result.
    `monitor` replaces the scenario's (it is closed here too); `pruner` stops a hopeless replay early."""
    results = await measure_lifetime(scenario, candidate, log_dir=log_dir, registry=registry, on_phase=on_phase,
                                     port=port, monitor=monitor, pruner=pruner)
    return results[0]


async def measure_lifetime(
    scenario: Scenario,
    candidate: Mapping[str, FlagValue],
    *,
    runs: int = 1,
    log_dir: Path,
    registry: EngineRegistry | None = None,
    on_phase: Phase | None = None,
    port: int | None = None,
    monitor: MemoryMonitor | None = None,
    pruner: Pruner | None = None,
    then: Scenario | None = None,
) -> list[TrialResult]:
    """`measure`, replaying the workload up to `runs` times on one engine: one result per replay that
    ran (fewer when a replay did not end ok: the engine is not asked for more). With `then` (the same
    engine under another workload: the soak), once every replay ended ok the engine serves `then`'s
    workload too, its result last: the replays' peak is theirs, the last result's the lifetime's."""
    phase = on_phase or (lambda _p: None)
    registry = registry or EngineRegistry()
    backend = backend_for(scenario)
    plan = plan_launch(scenario, candidate, port=port, extras=backend.argv_extras(scenario))
    holder = _Engine()
    monitor = monitor or backend.monitor(scenario, holder.pid)
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
            foreign = await foreign_within_allowance(scenario, monitor, registry, bool(reaped))
        return await _run(scenario, plan, monitor, holder, registry, log_dir, phase, foreign, pruner, runs, then)
    finally:
        monitor.close()
        if locks is not None:
            locks.release()


class _Abort:
    """Why a trial must stop early for reasons that are not the candidate's (set from the watcher)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.outcome: Outcome | None = None
        self.reason: str | None = None

    def set(self, outcome: Outcome, reason: str) -> None:
        if not self.event.is_set():
            self.outcome, self.reason = outcome, reason
            self.event.set()


async def _run(scenario: Scenario, plan: LaunchPlan, monitor: MemoryMonitor, holder: _Engine,
               registry: EngineRegistry, log_dir: Path, phase: Phase, foreign: list[ForeignMemory],
               pruner: Pruner | None, runs: int = 1, then: Scenario | None = None) -> list[TrialResult]:
    t_begin = time.monotonic()
    private_dir(log_dir)  # engine logs hold what the engine printed: the run's details
    log_path = log_dir / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{plan.port}.log"
    result = TrialResult(Outcome.OK, None, dict(plan.flags), _redact_argv(plan.argv), plan.redacted_env())
    result.engine["log_path"] = str(log_path)
    warning = unlisted_warning(foreign)
    if warning:
        result.warnings.append(warning)
    replays = [result]
    soak: TrialResult | None = None
    replays_end: tuple[float, list[int]] | None = None  # when the soak began, and the peak until then

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
        return [_monitor_failed(result, f"memory could not be read before launch: {exc}", t_begin)]
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
        why = await race(engine.wait_ready(plan.base_url, plan.served_name, scenario.engine.startup_timeout_s,
                                           plan.headers()), tripped, abort.event)
        result.startup_s = time.monotonic() - t_start
        if why is not None or tripped.is_set():
            if not abort.event.is_set():
                _startup_outcome(result, engine, why, tripped.is_set())
        else:
            engine.record_members()
            await serve_and_replay(scenario, plan, engine, result, tripped, abort.event, phase, pruner)
            while len(replays) < runs and replays[-1].outcome == Outcome.OK and not tripped.is_set() \
                    and not abort.event.is_set() and engine.returncode is None:
                again = _next_replay(result)
                replays.append(again)
                t_replay = time.monotonic()
                await serve_and_replay(scenario, plan, engine, again, tripped, abort.event, phase, pruner,
                                       replay=len(replays) - 1)
                again.duration_s = time.monotonic() - t_replay
            if then is not None and len(replays) == runs and replays[-1].outcome == Outcome.OK \
                    and not tripped.is_set() and not abort.event.is_set() and engine.returncode is None:
                # What happens from here on (an OOM, a crash) is the soak's, not the replays' before it.
                replays_end = sampler.mark()
                soak = _next_replay(result)
                t_soak = time.monotonic()
                await serve_and_replay(then, plan, engine, soak, tripped, abort.event, phase, None, replay=runs)
                soak.duration_s = time.monotonic() - t_soak
            if not tripped.is_set() and not abort.event.is_set() and engine.returncode is None:
                # A last look while the engine lives: a stranger that came after the watch's last one and
                # leaves as we stop is in this lifetime's peak all the same.
                grown = await _strangers(engine, monitor, foreign)
                if grown is not None:
                    abort.set(Outcome.INTERFERENCE, grown)
    except MonitorError as exc:
        monitor_error = str(exc)
    finally:
        phase("stopping")
        await cancel(watcher)
        engine.stop(grace_s=scenario.engine.stop_grace_s)
        if sampler.running:
            try:
                summary = sampler.stop()
            except MonitorError as exc:
                monitor_error = str(exc)
        holder.process = None
    grown = await asyncio.to_thread(foreign_growth, monitor, foreign, engine)
    if grown is not None:
        abort.set(Outcome.INTERFERENCE, grown)
    release_error: str | None = None
    try:
        released = await asyncio.to_thread(wait_for_release, monitor, baseline, RELEASE_TOLERANCE_BYTES,
                                           scenario.engine.release_timeout_s)
    except MonitorError as exc:
        released, release_error = True, str(exc)  # nothing to wait on; said below
    # What ended the lifetime ends each of its replays: the peak is the lifetime's, and a replay that
    # finished ok before the engine failed was measured on an engine that then failed. With a soak after
    # them, the replays end where it began: their peak is the one reached until then.
    parts = [(r, summary if replays_end is None else _until(summary, *replays_end), replays_end is None)
             for r in replays] + ([(soak, summary, True)] if soak is not None else [])
    for replay, seen, ended in parts:
        _finish(replay, engine, seen, tripped.is_set() and ended, ended)
        _foreign_record(replay, foreign, seen)
        if ended and abort.outcome is not None and abort.reason is not None:
            replay.outcome, replay.reason, replay.infrastructure = abort.outcome, abort.reason, True
            replay.metrics = {}
        elif (monitor_error is not None or summary is None) and \
                replay.outcome in (Outcome.OK, Outcome.CRASH, Outcome.TIMEOUT):
            _monitor_failed(replay, f"no memory evidence: {monitor_error or 'the sampler did not run'}")
        if release_error is not None:
            replay.warnings.append(f"GPU memory release could not be checked: {release_error}")
            if replay.outcome == Outcome.OK:  # a feasible claim needs the whole run watched
                _monitor_failed(replay, f"memory could not be read after the trial: {release_error}")
        if not released:
            replay.warnings.append(f"GPU memory not back to its pre-launch level within "
                                   f"{scenario.engine.release_timeout_s:g} s after the engine stopped")
    # The first replay carries the lifetime's start and stop; each later one its own replay's time.
    replays += [soak] if soak is not None else []
    result.duration_s = time.monotonic() - t_begin - sum(r.duration_s for r in replays[1:])
    for number, replay in enumerate(replays, 1):
        log.info("trial.measured", outcome=replay.outcome, reason=replay.reason, flags=replay.flags,
                 output_tokens_per_s=replay.metric("output_tokens_per_s"),
                 ttft_p95_s=replay.metric("ttft_p95_s"), peak_fraction=replay.peak_fraction,
                 foreign_mib=[round(f.bytes / MIB) for f in foreign], replay=number)
    return replays


def _next_replay(first: TrialResult) -> TrialResult:
    """Another replay on the running engine: the lifetime's launch and startup, its own measurements."""
    again = TrialResult(Outcome.OK, None, dict(first.flags), list(first.argv), dict(first.env),
                        startup_s=first.startup_s, warnings=list(first.warnings))
    again.engine["log_path"] = first.engine.get("log_path")
    return again


def _monitor_failed(result: TrialResult, reason: str, t_begin: float | None = None) -> TrialResult:
    """No memory evidence: a machine fault (retried), never feasible."""
    result.outcome, result.reason, result.infrastructure = Outcome.MONITOR_FAILED, reason, True
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


async def _watch(engine: EngineProcess, sampler: Sampler, monitor: MemoryMonitor, foreign: list[ForeignMemory],
                 abort: _Abort) -> None:
    """While the engine lives: stop the trial if the sampler dies (nobody watches the OOM wall) or
    other processes take memory on our GPUs; keep the engine's processes on record."""
    while True:
        await asyncio.sleep(WATCH_S)
        if sampler.failure is not None:
            abort.set(Outcome.MONITOR_FAILED, f"memory sampling failed during the trial: {sampler.failure}")
            return
        grown = await _strangers(engine, monitor, foreign)
        if grown is not None:
            abort.set(Outcome.INTERFERENCE, grown)
            return


async def _strangers(engine: EngineProcess, monitor: MemoryMonitor, foreign: list[ForeignMemory]) -> str | None:
    """What other processes took on our GPUs since launch, said; None when nobody did."""
    await asyncio.to_thread(engine.record_members)
    grown = await asyncio.to_thread(foreign_growth, monitor, foreign, engine)
    if grown is not None and await asyncio.to_thread(foreign_growth, monitor, foreign, engine, True) is None:
        # Only processes that are gone grew: a worker of ours that died since the last look (a failed
        # start) is no member any more, and the engine's log names it only once it is read that far.
        # Look again then; a live stranger is blamed at once.
        await asyncio.sleep(WATCH_S)
        grown = await asyncio.to_thread(foreign_growth, monitor, foreign, engine)
    return grown


def _startup_outcome(result: TrialResult, engine: EngineProcess, why: str | None, tripped: bool) -> None:
    if tripped:
        result.outcome, result.reason = Outcome.OOM_THRESHOLD, "memory crossed the OOM threshold during startup"
        return
    if why == "timeout":
        result.outcome = Outcome.TIMEOUT
        result.reason = "engine not ready within engine.startup_timeout_s"
        return
    # It exited: the log says why. Read it to the end first (children write after the leader exits).
    engine.stop(grace_s=1.0)
    facts = engine.facts
    result.outcome = facts.failure or Outcome.CRASH
    result.reason = facts.reason or f"engine exited with code {engine.returncode} during startup"
    if result.outcome == Outcome.CRASH and facts.reason and "Address already in use" in facts.reason:
        result.infrastructure = True


def _until(summary: MemorySummary | None, t_s: float, peak: list[int]) -> MemorySummary | None:
    """The lifetime's summary as it stood `t_s` after the sampler started, its peak then `peak` (when the
    soak began)."""
    if summary is None:
        return None
    fraction = max((p / t for p, t in zip(peak, summary.total_bytes, strict=True) if t > 0), default=0.0)
    return replace(summary, peak_bytes=list(peak), peak_fraction=fraction, threshold_event=None,
                   timeline=[point for point in summary.timeline if point[0] <= t_s])


def _finish(result: TrialResult, engine: EngineProcess, summary: MemorySummary | None, tripped: bool,
            ended: bool = True) -> None:
    """`ended`: the engine's end (a failure after ready, a crash) is this result's; not for replays that
    finished before a soak on the same engine began."""
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
        result.outcome = Outcome.OOM_THRESHOLD
        result.reason = (f"GPU {event.index} reached {event.used_bytes / 2**30:.2f} GiB of "
                         f"{event.total_bytes / 2**30:.2f} GiB (threshold {event.limit_bytes / 2**30:.2f} GiB)"
                         if event is not None else "memory crossed the OOM threshold")
        return
    if result.outcome != Outcome.OK or not ended:
        return
    if facts.failure is not None and facts.failure_after_ready:
        result.outcome, result.reason = facts.failure, facts.reason
    elif engine.returncode not in (None, 0) and not engine.stopping:
        result.outcome = Outcome.CRASH
        result.reason = result.reason or f"engine exited with code {engine.returncode} while serving"


def _redact_argv(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, part in enumerate(out[:-1]):
        if part == "--api-key":
            out[i + 1] = "***"
    return out
