"""How a step reaches the GPU: the device (real or stood in for), our NVML monitor over the real
driver or the simulator's, waiting until the card is idle, and queries whose refusal is a finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tools.gpu_check.config import CheckConfig
from tools.gpu_check.device import Device
from tools.gpu_check.records import Recorder
from tools.gpu_check.stand_in import CpuStandIn
from tools.gpu_check.torch_cuda import TorchCuda


def open_device(config: CheckConfig) -> Device:
    """The GPU itself (torch on CUDA), or CpuStandIn in a dry run."""
    return CpuStandIn(config.gpu_index) if config.dry_run else TorchCuda(config.gpu_index)


def open_nvml(config: CheckConfig) -> Any:
    """Our NVML monitor over the real driver, or over the simulator's GPUs in a dry run."""
    from autotuner.monitor import open_monitor

    return open_monitor("sim" if config.dry_run else "nvml", [config.gpu_index])


def nvml_module(config: CheckConfig) -> Any:
    """The NVML bindings themselves (pynvml), or the simulator's in a dry run, for what the monitor does not ask."""
    if config.dry_run:
        from autotuner.sim import nvml as module
    else:
        import pynvml as module
    return module


def wait_idle(monitor: Any, rec: Recorder, timeout_s: float = 20.0) -> None:
    """Wait until the last step's memory is back with the driver (it frees a dead process's memory a
    little after the exit): a baseline taken before that would be the last step's footprint."""
    from autotuner.monitor import wait_until

    limit = int(0.05 * monitor.devices()[0].total_bytes)
    t = time.perf_counter()
    idle = wait_until(monitor, lambda used: used[0] < limit, timeout_s, interval_s=0.01)
    rec.set("idle_wait", {"idle": idle, "seconds": time.perf_counter() - t, "used_bytes": monitor.sample()[0]})


def settled_sample(monitor: Any, still_s: float = 0.6, timeout_s: float = 3.0) -> int:
    """GPU 0's used bytes once unchanged for `still_s`: memory just handed back (`empty_cache`) reaches the
    driver's figure a little later (the simulated driver: 0.5 s), and a baseline read before then hides the
    next run's rise under the last one's pool."""
    deadline = time.perf_counter() + timeout_s
    last = monitor.sample()[0]
    since = time.perf_counter()
    while time.perf_counter() < deadline:
        time.sleep(0.05)
        now = monitor.sample()[0]
        if now != last:
            last, since = now, time.perf_counter()
        elif time.perf_counter() - since >= still_s:
            break
    return last


def attempt(fn: Callable[[], Any]) -> Any:
    """fn's value, or {"error": ...}: a query the driver refuses (process lists in some containers)
    is a finding, not the end of the step."""
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
