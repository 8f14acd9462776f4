"""A drop-in for the parts of ``pynvml`` (nvidia-ml-py) a memory monitor uses, over simulated GPUs.

Pass this module where the monitor expects ``pynvml``. Like the real library, ``nvmlInit()`` binds to
"the driver" at init: it reads ``$AUTOTUNER_SIM_STATE_DIR`` (see ``autotuner.sim.gpu_state``) and
the GPU inventory then; a missing or empty inventory means zero devices. Memory figures are
instantaneous, read from the holder files at each call; there is no history, as with real NVML.
Errors mirror pynvml: ``NVMLError(code)`` becomes the matching ``NVMLError_*`` subclass, ``.value``
is the code and ``str()`` is NVML's text ("Uninitialized", "Invalid Argument", ...).
"""

# pynvml's public names (camelCase functions, NVMLError_* classes, struct field names) are the point.
# ruff: noqa: N801, N802, N815, N818

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from autotuner.errors import AutotunerError
from autotuner.sim.gpu_state import GpuHost, SimGpu, state_dir_from_env

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

# What the real driver reports for gpuInstanceId/computeInstanceId outside MIG mode.
NVML_VALUE_NOT_AVAILABLE_UINT = 0xFFFFFFFF
DRIVER_VERSION = "550.00-sim"

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(AutotunerError):
    """pynvml's error: ``NVMLError(code)`` returns an instance of the subclass for that code."""

    _code: int | None = None
    _by_code: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - filled once, below
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        # Like pynvml: NVMLError(code) picks the subclass, a subclass knows its own code.
        if cls._code is None:
            value = int(args[0])
            target = NVMLError._by_code.get(value, cls)
        else:
            value, target = cls._code, cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls._code is not None:
            NVMLError._by_code[cls._code] = cls

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


# pynvml generates these names from the NVML_ERROR_* constants; spelled out here so they type-check.
class NVMLError_Uninitialized(NVMLError):
    _code = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    _code = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    _code = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    _code = NVML_ERROR_NO_PERMISSION


class NVMLError_AlreadyInitialized(NVMLError):
    _code = NVML_ERROR_ALREADY_INITIALIZED


class NVMLError_NotFound(NVMLError):
    _code = NVML_ERROR_NOT_FOUND


class NVMLError_InsufficientSize(NVMLError):
    _code = NVML_ERROR_INSUFFICIENT_SIZE


class NVMLError_DriverNotLoaded(NVMLError):
    _code = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_Timeout(NVMLError):
    _code = NVML_ERROR_TIMEOUT


class NVMLError_LibraryNotFound(NVMLError):
    _code = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_FunctionNotFound(NVMLError):
    _code = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    _code = NVML_ERROR_GPU_IS_LOST


class NVMLError_Unknown(NVMLError):
    _code = NVML_ERROR_UNKNOWN


@dataclass(frozen=True)
class SimDeviceHandle:
    """Stands for pynvml's opaque ``c_nvmlDevice_t``: callers only pass it back."""

    index: int
    gpu: SimGpu


@dataclass
class c_nvmlMemory_t:
    """Same fields as pynvml's; ``reserved`` and ``version`` are there for the v2 call."""

    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = NVML_VALUE_NOT_AVAILABLE_UINT
    computeInstanceId: int = NVML_VALUE_NOT_AVAILABLE_UINT


@dataclass
class _Session:
    host: GpuHost
    gpus: list[SimGpu]
    refcount: int


_lock = threading.Lock()
_session: _Session | None = None


def _current() -> _Session:
    session = _session
    if session is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return session


def _gpu(handle: SimDeviceHandle) -> tuple[GpuHost, SimGpu]:
    session = _current()
    if not isinstance(handle, SimDeviceHandle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return session.host, handle.gpu


def _live(handle: SimDeviceHandle) -> tuple[GpuHost, SimGpu]:
    """Like `_gpu`, for queries of the device's state: an injected fault (gpu_state) fails them."""
    host, gpu = _gpu(handle)
    fault = host.nvml_fault(gpu.index)
    if fault is not None:
        raise NVMLError(fault)
    return host, gpu


def nvmlInit() -> None:
    """Bind to the simulated GPUs named by ``$AUTOTUNER_SIM_STATE_DIR`` now (refcounted, like pynvml)."""
    global _session
    with _lock:
        if _session is not None:
            _session.refcount += 1
            return
        host = GpuHost(state_dir_from_env())
        _session = _Session(host=host, gpus=host.inventory(), refcount=1)


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _session
    with _lock:
        session = _current()
        session.refcount -= 1
        if session.refcount == 0:
            _session = None


def nvmlSystemGetDriverVersion() -> str:
    _current()
    return DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(_current().gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> SimDeviceHandle:
    gpus = _current().gpus
    if not isinstance(index, int) or not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SimDeviceHandle(index, gpus[index])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> SimDeviceHandle:
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, gpu in enumerate(_current().gpus):
        if gpu.uuid == wanted:
            return SimDeviceHandle(i, gpu)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: SimDeviceHandle) -> int:
    return _gpu(handle)[1].index


def nvmlDeviceGetName(handle: SimDeviceHandle) -> str:
    return _gpu(handle)[1].name


def nvmlDeviceGetUUID(handle: SimDeviceHandle) -> str:
    return _gpu(handle)[1].uuid


def nvmlDeviceGetMemoryInfo(handle: SimDeviceHandle, version: int | None = None) -> c_nvmlMemory_t:
    host, gpu = _live(handle)
    total = gpu.memory_total_bytes
    # A real GPU cannot report more used than it has: clamp, so used + free == total always.
    used = min(host.used_bytes(gpu.index), total)
    return c_nvmlMemory_t(total=total, free=total - used, used=used, version=version or 0)


def nvmlDeviceGetComputeRunningProcesses(handle: SimDeviceHandle) -> list[c_nvmlProcessInfo_t]:
    host, gpu = _live(handle)
    return [c_nvmlProcessInfo_t(pid=h.pid, usedGpuMemory=h.bytes) for h in host.holders(gpu.index) if h.listed]


def nvmlDeviceGetGraphicsRunningProcesses(handle: SimDeviceHandle) -> list[c_nvmlProcessInfo_t]:
    _gpu(handle)
    return []  # a headless inference box: compute contexts only
