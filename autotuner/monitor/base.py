"""What every memory monitor offers: a fixed list of devices and an instantaneous reading of each.

A "device" is whatever can run out of memory under an engine: a GPU (NVML) or, for CPU engines and
cpu-offload, the engine's process tree and the host's RAM. Positions (0..n-1 in ``devices()``) are
what the sampler and the timeline use; ``DeviceInfo.index`` is the name the user knows (the NVML
index of a GPU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType

from autotuner.errors import InfrastructureError, UserInputError


class MonitorError(InfrastructureError):
    """Reading memory failed while it should have worked (NVML call failed, GPU lost): retry."""


class MonitorConfigError(UserInputError):
    """The user asked for something this machine cannot do: a GPU index it lacks, NVML without a driver."""


class NvmlUnavailableError(MonitorConfigError):
    """NVML cannot be initialised or sees no GPU; ``monitor: auto`` falls back to host memory on this."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str
    total_bytes: int
    # Memory the whole box draws on (host RAM): other processes move it, so an engine's release cannot
    # be read from it; the engine's own share is another device (its process tree).
    shared: bool = False


class MemoryMonitor(ABC):
    """Instantaneous memory readings of a fixed set of devices. ``sample()`` may run on another thread."""

    @abstractmethod
    def devices(self) -> list[DeviceInfo]:
        """The monitored devices, in the order ``sample()`` reports them."""

    @abstractmethod
    def sample(self) -> list[int]:
        """Bytes in use on each monitored device right now; raises ``MonitorError``."""

    @abstractmethod
    def processes(self, position: int) -> list[tuple[int, int]]:
        """(pid, bytes) of the processes holding memory on the device at ``position``."""

    @abstractmethod
    def close(self) -> None:
        """Release the backend; idempotent."""

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
