"""The GPUs this host has, through NVML: the real library, or the simulator's (as the monitor does)."""

from __future__ import annotations

import contextlib
import os
from typing import Literal

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
