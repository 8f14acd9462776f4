"""Simulated GPUs of a private state dir, worker processes that hold memory on them, monitors over them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotuner.monitor import NvmlMonitor
from autotuner.sim import nvml as sim_nvml
from autotuner.sim.gpu_state import GpuHost, make_gpus
from autotuner.sim.worker_pool import WorkerPool
from tests.support.sim_gpus import GPU_NAME, GPU_TOTAL


@pytest.fixture
def gpu_host(state_dir: Path) -> GpuHost:
    """A simulated box of 8 RTX 3090s."""
    host = GpuHost(state_dir)
    host.ensure_inventory(make_gpus(state_dir, GPU_NAME, GPU_TOTAL, 8))
    return host


@pytest.fixture
def start_pool(gpu_host: GpuHost) -> Iterator[Callable[[list[int]], WorkerPool]]:
    """Start worker pools on given GPUs; every one is stopped (and its processes reaped) at the end."""
    pools: list[WorkerPool] = []

    def start(indices: list[int]) -> WorkerPool:
        pool = WorkerPool(gpu_host.state_dir, indices)
        pools.append(pool)
        pool.start()
        return pool

    yield start
    for pool in pools:
        pool.stop()


@pytest.fixture
def open_sim_monitor(gpu_host: GpuHost) -> Iterator[Callable[[list[int] | None], NvmlMonitor]]:
    monitors: list[NvmlMonitor] = []

    def open_(indices: list[int] | None) -> NvmlMonitor:
        monitor = NvmlMonitor(sim_nvml, indices)
        monitors.append(monitor)
        return monitor

    yield open_
    for monitor in monitors:
        monitor.close()
