"""Memory on our GPUs that is not ours: a desktop's Xorg on GPU 0, someone's notebook, a process of
another PID namespace. Measured before each launch as the foreign baseline, budgeted against an
allowance, and watched during the trial: growth means someone else started using the GPU.

Before a launch none of our engines runs (they are stopped and their memory waited for), so a
device's used memory *is* the foreign baseline; NVML's process list only names its holders. Inside a
container without the host's PID namespace NVML lists no process while memory is in use: the used
memory still counts, with a warning saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import psutil

from autotuner.monitor.base import MemoryMonitor

MIB = 1 << 20
# Used memory with no process listed below this is the driver's own, not worth a warning.
UNLISTED_WARN_BYTES = 64 * MIB
# Foreign memory that grows by more than this during a trial is someone else's new job.
INTERFERENCE_BYTES = 256 * MIB


@dataclass(frozen=True)
class ForeignProcess:
    pid: int
    name: str
    bytes: int

    def text(self) -> str:
        return f"{self.name} (pid {self.pid}, {self.bytes / MIB:.0f} MiB)"


@dataclass(frozen=True)
class ForeignMemory:
    """What other processes hold on one GPU."""

    index: int
    bytes: int
    processes: list[ForeignProcess] = field(default_factory=list)
    unlisted: bool = False  # memory in use, no process listed (another PID namespace)

    def text(self) -> str:
        if self.unlisted:
            return f"GPU {self.index}: {self.bytes / MIB:.0f} MiB in use by processes NVML does not list"
        held = ", ".join(p.text() for p in self.processes) or "unnamed processes"
        return f"GPU {self.index}: {self.bytes / MIB:.0f} MiB held by {held}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name() or "?"
    except psutil.Error:
        return "?"


def foreign_processes(monitor: MemoryMonitor, position: int, is_ours: Callable[[int], bool]) -> \
        list[ForeignProcess]:
    return [ForeignProcess(pid, process_name(pid), n) for pid, n in monitor.processes(position) if not is_ours(pid)]


def foreign_baseline(monitor: MemoryMonitor, is_ours: Callable[[int], bool] = lambda _pid: False) -> \
        list[ForeignMemory]:
    """Per monitored GPU, before launch: used memory and who holds it (our own processes excluded)."""
    # Processes first, then memory: what exits in between lowers `used` (never counted as foreign),
    # instead of leaving memory nobody is listed for.
    listings = [monitor.processes(position) for position in range(len(monitor.devices()))]
    used = monitor.sample()
    out = []
    for position, device in enumerate(monitor.devices()):
        listed = listings[position]
        procs = [ForeignProcess(pid, process_name(pid), n) for pid, n in listed if not is_ours(pid)]
        ours = sum(n for pid, n in listed if is_ours(pid))
        foreign = max(0, used[position] - ours)
        unlisted = not listed and foreign >= UNLISTED_WARN_BYTES
        out.append(ForeignMemory(device.index, foreign, procs, unlisted))
    return out


def unlisted_warning(baseline: list[ForeignMemory]) -> str | None:
    gpus = [f for f in baseline if f.unlisted]
    if not gpus:
        return None
    held = ", ".join(f"GPU {f.index} {f.bytes / MIB:.0f} MiB" for f in gpus)
    return (f"memory is in use with no process listed ({held}): NVML cannot see processes of another PID "
            "namespace (a container without --pid=host). Counted as foreign memory; what holds it and "
            "whether it grows cannot be named.")
