"""The GPU guard: nobody else's memory on our GPUs, and no other autotuner either.

Before tuning, what other processes hold bounds the utilization that can start (`gpu_headroom`); for
the whole study the scenario's GPUs stay locked against other autotuners (`hold_gpus`); before each
launch the foreign memory must be within the allowance (`foreign_within_allowance`, else
`GpusBusyError`), and during a trial it must not grow (`foreign_growth`: the trial is then the
machine's fault, not the candidate's). Separate from the trial lifecycle: the same checks stand
around every engine lifetime, whatever the lifetime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import psutil
import structlog

from autotuner.backends import backend_for
from autotuner.engine.gpu_locks import GpuLocks, GpusBusyError
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.monitor import HostMonitor, MemoryMonitor, MonitorError
from autotuner.monitor.foreign import (
    INTERFERENCE_BYTES,
    MIB,
    ForeignMemory,
    foreign_baseline,
    foreign_processes,
    unlisted_warning,
)
from autotuner.scenario import Scenario

log = structlog.get_logger(__name__)


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
    with backend_for(scenario).monitor(scenario) as monitor:
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
    with backend_for(scenario).monitor(scenario) as monitor:
        devices = [] if isinstance(monitor, HostMonitor) else [(d.index, d.uuid) for d in monitor.devices()]
    with GpuLocks(devices):
        yield


async def foreign_within_allowance(scenario: Scenario, monitor: MemoryMonitor, registry: EngineRegistry,
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
                raise GpusBusyError(busy_message(over, scenario.monitor.foreign_allowance_mib))
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
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def busy_message(over: list[ForeignMemory], allowance_mib: int) -> str:
    """Why the GPUs count as busy, and what the user can do about it."""
    parts = "; ".join(f.text() for f in over)
    need = max(f.bytes for f in over) / MIB
    return (f"GPUs busy — {parts}: more than monitor.foreign_allowance_mib = {allowance_mib} MiB of other "
            f"processes' memory. Stop those processes, pick other GPUs with engine.gpus, or raise "
            f"monitor.foreign_allowance_mib to at least {need:.0f} if they stay (the tuner then budgets "
            "around them); autotuner never kills processes it did not start.")


def _is_ours(engine: EngineProcess) -> Callable[[int], bool]:
    known = engine.known_pids
    logged = engine.logged_pids
    leader = engine.pid_or_none

    def ours(pid: int) -> bool:
        if pid in known:
            return True
        # A worker that failed and exited between two of our looks: named in the engine's log, gone now
        # (a live process of that PID is a stranger's: a container's log names PIDs of its own namespace).
        if pid in logged and not _running(pid):
            return True
        try:
            return leader is not None and os.getpgid(pid) == leader
        except OSError:
            return False

    return ours


def foreign_growth(monitor: MemoryMonitor, foreign: list[ForeignMemory], engine: EngineProcess,
                   live_only: bool = False) -> str | None:
    """Other processes' memory that grew since the baseline, as a reason; None if none did (or if
    NVML names no holder at all, as in a container: then growth cannot be told from ours). `live_only`:
    count only processes still running (a dead one's memory is on its way out)."""
    if not foreign:
        return None
    known = _is_ours(engine)

    def ours(pid: int) -> bool:
        return known(pid) or (live_only and not _running(pid))

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
