"""GPU memory through any module shaped like ``pynvml``: the real one, or ``autotuner.sim.nvml``.

Indices are NVML indices, as ``nvidia-smi`` numbers GPUs: NVML ignores ``CUDA_VISIBLE_DEVICES`` and
orders by PCI bus id. The engine launcher must therefore start engines with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that the indices it passes in ``CUDA_VISIBLE_DEVICES`` name the
same cards this monitor watches.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from autotuner.monitor.base import (
    DeviceInfo,
    MemoryMonitor,
    MonitorConfigError,
    MonitorError,
    NvmlUnavailableError,
)

_FALLBACK_HINT = "use monitor: host or sim"


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlMonitor(MemoryMonitor):
    """Watches the GPUs at ``indices`` (all of them when None). Handles are fetched once, here."""

    def __init__(self, module: ModuleType, indices: list[int] | None = None) -> None:
        self._nvml: Any = module
        self._error: type[Exception] = module.NVMLError
        try:
            module.nvmlInit()
        except self._error as exc:
            raise NvmlUnavailableError(f"NVML not available: {exc}; {_FALLBACK_HINT}") from exc
        self._open = True
        try:
            self._handles, self._devices = self._bind(indices)
        except BaseException:
            self.close()
            raise

    def _bind(self, indices: list[int] | None) -> tuple[list[Any], list[DeviceInfo]]:
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._error as exc:
            raise NvmlUnavailableError(f"NVML not available: {exc}; {_FALLBACK_HINT}") from exc
        if count == 0:
            raise NvmlUnavailableError(f"NVML not available: it sees no GPU; {_FALLBACK_HINT}")
        wanted = list(range(count)) if indices is None else list(indices)
        if not wanted:
            raise MonitorConfigError("no GPU index given: name at least one GPU to monitor")
        for index in wanted:
            if not 0 <= index < count:
                raise MonitorConfigError(
                    f"GPU index {index} does not exist: this machine has {count} GPU"
                    f"{'s' if count != 1 else ''} (NVML indices 0-{count - 1})"
                )
        duplicates = sorted({i for i in wanted if wanted.count(i) > 1})
        if duplicates:
            raise MonitorConfigError(f"GPU indices listed twice: {duplicates}")
        handles: list[Any] = []
        devices: list[DeviceInfo] = []
        try:
            for index in wanted:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
                name = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                handles.append(handle)
                devices.append(DeviceInfo(index=index, name=name, uuid=uuid, total_bytes=total))
        except self._error as exc:
            raise MonitorError(f"NVML failed while opening GPU {index}: {exc}") from exc
        return handles, devices

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def sample(self) -> list[int]:
        get = self._nvml.nvmlDeviceGetMemoryInfo
        try:
            return [int(get(handle).used) for handle in self._handles]
        except self._error as exc:
            raise MonitorError(f"NVML memory query failed: {exc}") from exc

    def processes(self, position: int) -> list[tuple[int, int]]:
        if not 0 <= position < len(self._handles):  # a negative position is no device, not the last one
            raise IndexError(f"no monitored device at position {position} (0..{len(self._handles) - 1})")
        handle = self._handles[position]
        found: dict[int, int] = {}
        try:
            infos = [
                *self._nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                *self._nvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
            ]
        except self._error as exc:
            raise MonitorError(
                f"NVML process query failed on GPU {self._devices[position].index}: {exc}"
            ) from exc
        for info in infos:
            # usedGpuMemory is None where the driver will not say (some containers, Windows WDDM);
            # the process is still there, so it still counts as holding the GPU.
            found[int(info.pid)] = found.get(int(info.pid), 0) + int(info.usedGpuMemory or 0)
        return sorted(found.items())

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        # A shutdown that fails leaves nothing for us to undo.
        with contextlib.suppress(self._error):
            self._nvml.nvmlShutdown()
