"""The GPUs this host has, through NVML: the real library, or the simulator's (as the monitor does)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Literal

from autotuner.monitor.base import MonitorError, NvmlUnavailableError
from autotuner.monitor.factory import _real_pynvml, _sim_pynvml, nvml_loader
from autotuner.monitor.nvml import NvmlMonitor
from autotuner.sim.gpu_state import STATE_DIR_ENV
from autotuner.watch.snapshot import GpuInfo

InventoryKind = Literal["auto", "nvml", "sim"]
MIB = 1 << 20


def gpu_inventory(kind: InventoryKind = "auto") -> tuple[GpuInfo, ...]:
    """Every GPU NVML sees, by NVML index. `auto`: real NVML when it sees any GPU, else the simulator's
    when `$AUTOTUNER_SIM_STATE_DIR` names a simulated host, else none (an empty tuple)."""
    loader = nvml_loader(kind)
    if loader is not None:  # asked for by name: its failure is the caller's to see
        return _read(loader())
    with contextlib.suppress(NvmlUnavailableError):
        return _read(_real_pynvml())
    if os.environ.get(STATE_DIR_ENV):
        with contextlib.suppress(NvmlUnavailableError):
            return _read(_sim_pynvml())
    return ()


def _read(module: object) -> tuple[GpuInfo, ...]:
    monitor = NvmlMonitor(module, None)  # type: ignore[arg-type]
    try:
        return tuple(GpuInfo(index=d.index, uuid=d.uuid, name=d.name, memory_total_mib=d.total_bytes // MIB)
                     for d in monitor.devices())
    except MonitorError as exc:
        raise NvmlUnavailableError(str(exc)) from exc
    finally:
        monitor.close()


def gpu_used_bytes(kind: InventoryKind = "auto") -> tuple[tuple[GpuInfo, int], ...]:
    """Each GPU with the bytes in use on it now (every process's, ours included); () where no NVML. The
    same fallbacks as `gpu_inventory`."""
    loader = nvml_loader(kind)
    if loader is not None:
        return _read_used(loader())
    with contextlib.suppress(NvmlUnavailableError):
        return _read_used(_real_pynvml())
    if os.environ.get(STATE_DIR_ENV):
        with contextlib.suppress(NvmlUnavailableError):
            return _read_used(_sim_pynvml())
    return ()


def gpu_holders(kind: InventoryKind = "auto") -> tuple[tuple[GpuInfo, int, tuple[tuple[int, int], ...]], ...]:
    """Each GPU with the bytes in use on it and the (pid, bytes) NVML lists for it; () where no NVML."""
    loader = nvml_loader(kind)
    if loader is not None:
        return _read_used(loader(), holders=True)
    with contextlib.suppress(NvmlUnavailableError):
        return _read_used(_real_pynvml(), holders=True)
    if os.environ.get(STATE_DIR_ENV):
        with contextlib.suppress(NvmlUnavailableError):
            return _read_used(_sim_pynvml(), holders=True)
    return ()


def _read_used(module: object, holders: bool = False) -> tuple[Any, ...]:
    monitor = NvmlMonitor(module, None)  # type: ignore[arg-type]
    try:
        devices = monitor.devices()
        listed = [tuple(monitor.processes(i)) for i in range(len(devices))] if holders else []
        used = monitor.sample()
    except MonitorError as exc:
        raise NvmlUnavailableError(str(exc)) from exc
    finally:
        monitor.close()
    gpus = [GpuInfo(d.index, d.uuid, d.name, d.total_bytes // MIB) for d in devices]
    if holders:
        return tuple((g, u, procs) for g, u, procs in zip(gpus, used, listed, strict=True))
    return tuple(zip(gpus, used, strict=True))
