"""Pick a memory monitor by name: the scenario's ``monitor:`` field."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Literal, get_args

import structlog

from autotuner.monitor.base import MemoryMonitor, MonitorConfigError, NvmlUnavailableError
from autotuner.monitor.host import HostMonitor
from autotuner.monitor.nvml import NvmlMonitor

MonitorKind = Literal["nvml", "sim", "host", "auto"]
MONITOR_KINDS: tuple[str, ...] = get_args(MonitorKind)

log = structlog.get_logger(__name__)


def nvml_loader(kind: str) -> Callable[[], ModuleType] | None:
    """What loads the NVML library a monitor (or the GPU inventory) of `kind` reads: the simulator's
    (`sim`) or the real one (`nvml`); None for a kind that reads no NVML of its own choosing."""
    return {"sim": _sim_pynvml, "nvml": _real_pynvml}.get(kind)


def open_monitor(
    kind: MonitorKind,
    gpu_indices: list[int] | None,
    root_pid: Callable[[], int | None] | int | None = None,
) -> MemoryMonitor:
    """``sim``: the simulator's GPUs; ``nvml``: real GPUs; ``host``: the engine's process tree and
    host RAM (``gpu_indices`` unused); ``auto``: real GPUs if NVML works and sees any, else host."""
    loader = nvml_loader(kind)
    if loader is not None:
        return NvmlMonitor(loader(), gpu_indices)
    if kind == "host":
        return HostMonitor(root_pid)
    if kind == "auto":
        try:
            monitor: MemoryMonitor = NvmlMonitor(_real_pynvml(), gpu_indices)
        except NvmlUnavailableError as exc:
            # A bad GPU index is still the user's error: only "no NVML at all" falls back.
            log.info("memory_monitor.selected", kind="host", reason=str(exc))
            return HostMonitor(root_pid)
        log.info("memory_monitor.selected", kind="nvml", gpus=[d.index for d in monitor.devices()])
        return monitor
    raise MonitorConfigError(f"unknown memory monitor {kind!r}: use one of {', '.join(MONITOR_KINDS)}")


def _sim_pynvml() -> ModuleType:
    from autotuner.sim import nvml as sim_nvml  # lazily: the simulator is not loaded for real GPUs

    return sim_nvml


def _real_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(
            f"NVML not available: the pynvml module is missing ({exc}); install nvidia-ml-py, "
            "or use monitor: host or sim"
        ) from exc
    return pynvml
