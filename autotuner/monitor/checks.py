"""Checks around an engine launch: is anyone else on our GPUs, and is the last engine's memory gone."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from autotuner.monitor.base import MemoryMonitor


def wait_until(
    monitor: MemoryMonitor,
    predicate: Callable[[list[int]], bool],
    timeout: float,
    interval_s: float = 0.02,
) -> bool:
    """Poll ``monitor.sample()`` until ``predicate`` holds (True) or ``timeout`` passes (False).

    The predicate is always tried at least once, and once more at the deadline, so a zero timeout
    is a plain check and a release that lands during the last sleep still counts.
    """
    deadline = time.perf_counter() + timeout
    while True:
        if predicate(monitor.sample()):
            return True
        left = deadline - time.perf_counter()
        if left <= 0:
            return False
        time.sleep(min(interval_s, left))


def wait_for_release(
    monitor: MemoryMonitor,
    baseline: list[int],
    tolerance_bytes: int,
    timeout: float,
    interval_s: float = 0.02,
) -> bool:
    """Wait until every device is back within ``tolerance_bytes`` of ``baseline`` (its pre-launch use).

    The next launch must never meet the last one's memory: a driver frees a dead process's memory
    a little after it exits, and an orphaned worker keeps it until killed. A shared device (host RAM)
    is not waited on: the rest of the box moves it by more than the tolerance, so the wait would run to
    its timeout after every engine on a busy host; the engine's own tree is the device that says.
    """
    devices = monitor.devices()
    if len(baseline) != len(devices):
        raise ValueError(f"baseline has {len(baseline)} values for {len(devices)} devices")
    limits = [None if d.shared else b + tolerance_bytes for b, d in zip(baseline, devices, strict=True)]
    return wait_until(
        monitor,
        lambda used: all(lim is None or u <= lim for u, lim in zip(used, limits, strict=True)),
        timeout,
        interval_s,
    )


def busy_devices(monitor: MemoryMonitor, ignore_pids: Iterable[int] = ()) -> dict[int, list[tuple[int, int]]]:
    """Device index → (pid, bytes) of processes other than ``ignore_pids`` holding memory on it.

    Only devices with such processes appear. In a container without the host's PID namespace NVML
    may list no process while memory is in use: compare ``sample()`` with the expected idle use too.
    """
    ignored = set(ignore_pids)
    busy: dict[int, list[tuple[int, int]]] = {}
    for position, device in enumerate(monitor.devices()):
        holders = [(pid, n) for pid, n in monitor.processes(position) if pid not in ignored]
        if holders:
            busy[device.index] = holders
    return busy
