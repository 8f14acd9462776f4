"""What the steps ask of the GPU (``Device``): ``TorchCuda`` does it for real, ``CpuStandIn`` by
formula in a dry run. Only those two classes touch the device.
"""

from __future__ import annotations

from typing import Any, Protocol

from tools.gpu_check.prefill import Chunk


class DeviceOutOfMemoryError(Exception):
    """The device refused an allocation; ``message`` is the text the framework gave."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Device(Protocol):
    """What the steps ask of the GPU; TorchCuda does it for real, CpuStandIn by formula."""

    label: str

    def hold(self, nbytes: int) -> None: ...  # a plain allocation; raises DeviceOutOfMemoryError
    def release_all(self) -> None: ...
    def free_bytes(self) -> tuple[int, int]: ...  # (free, total) as the framework sees them
    def oom_error_type(self) -> type[BaseException]: ...
    def versions(self) -> dict[str, str]: ...
    def memory(self) -> tuple[int, int]: ...  # (allocated, reserved) by the caching allocator
    def reset_peak(self) -> None: ...
    def peak(self) -> tuple[int, int]: ...  # (max allocated, max reserved) since reset_peak
    def empty_cache(self) -> None: ...
    def load_model(self, spec: Any, layers: int | None) -> int: ...  # weight bytes
    def reserve_kv(self, nbytes: int) -> int: ...  # KV tokens it holds
    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> Any: ...
    def attention_agreement(self) -> float: ...
