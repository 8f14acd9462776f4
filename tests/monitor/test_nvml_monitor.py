"""NvmlMonitor over simulated GPUs whose memory is held by real worker processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from autotuner.errors import InfrastructureError, UserInputError
from autotuner.monitor import MonitorConfigError, MonitorError, NvmlMonitor, NvmlUnavailableError
from autotuner.sim import nvml as sim_nvml
from autotuner.sim.gpu_state import GpuHost
from autotuner.sim.worker_pool import WorkerPool
from tests.support.sim_gpus import GIB, GPU_NAME, GPU_TOTAL

OpenMonitor = Callable[[list[int] | None], NvmlMonitor]
StartPool = Callable[[list[int]], WorkerPool]


def test_devices_follow_the_requested_nvml_indices_in_order(
    open_sim_monitor: OpenMonitor, gpu_host: GpuHost
) -> None:
    monitor = open_sim_monitor([5, 2])
    inventory = gpu_host.inventory()
    assert [(d.index, d.name, d.uuid, d.total_bytes) for d in monitor.devices()] == [
        (5, GPU_NAME, inventory[5].uuid, GPU_TOTAL),
        (2, GPU_NAME, inventory[2].uuid, GPU_TOTAL),
    ]
    assert [d.index for d in open_sim_monitor(None).devices()] == list(range(8))


def test_sample_reads_the_memory_workers_hold_on_the_monitored_gpus_only(
    open_sim_monitor: OpenMonitor, start_pool: StartPool
) -> None:
    monitor = open_sim_monitor([5, 2])
    assert monitor.sample() == [0, 0]
    pool = start_pool([2, 5, 6])
    pool.set_bytes([3 * GIB, 7 * GIB, 11 * GIB])
    assert monitor.sample() == [7 * GIB, 3 * GIB]
    pool.set_bytes([GIB, 2 * GIB, 0])
    assert monitor.sample() == [2 * GIB, GIB]


def test_processes_names_the_holders_of_each_gpu(open_sim_monitor: OpenMonitor, start_pool: StartPool) -> None:
    monitor = open_sim_monitor([0, 1, 2])
    first, second = start_pool([0, 1]), start_pool([1])
    first.set_bytes([GIB, 2 * GIB])
    second.set_bytes([4 * GIB])
    assert monitor.processes(0) == [(first.pids[0], GIB)]
    assert monitor.processes(1) == sorted([(first.pids[1], 2 * GIB), (second.pids[0], 4 * GIB)])
    assert monitor.processes(2) == []


def test_a_gpu_index_the_box_lacks_is_a_user_error_naming_index_and_count(gpu_host: GpuHost) -> None:
    with pytest.raises(MonitorConfigError) as info:
        NvmlMonitor(sim_nvml, [0, 9])
    assert isinstance(info.value, UserInputError)
    assert "GPU index 9" in str(info.value)
    assert "8 GPUs" in str(info.value)
    with pytest.raises(MonitorConfigError, match="GPU index -1"):
        NvmlMonitor(sim_nvml, [-1])
    with pytest.raises(MonitorConfigError, match=r"listed twice: \[3\]"):
        NvmlMonitor(sim_nvml, [3, 1, 3])
    # Each failed open shut its NVML session down again.
    with pytest.raises(sim_nvml.NVMLError_Uninitialized):
        sim_nvml.nvmlDeviceGetCount()


def test_no_gpus_means_nvml_unavailable(state_dir: Path) -> None:
    with pytest.raises(NvmlUnavailableError, match="NVML not available: it sees no GPU; use monitor: host or sim"):
        NvmlMonitor(sim_nvml, None)


def test_real_nvml_without_a_driver_says_why_and_what_to_use() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        reason = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    with pytest.raises(NvmlUnavailableError) as info:
        NvmlMonitor(pynvml, [0])
    assert str(info.value) == f"NVML not available: {reason}; use monitor: host or sim"


def test_close_ends_the_nvml_session_once(gpu_host: GpuHost) -> None:
    with NvmlMonitor(sim_nvml, [0]) as monitor:
        assert sim_nvml.nvmlDeviceGetCount() == 8
    monitor.close()  # idempotent: a second shutdown would raise Uninitialized in pynvml
    with pytest.raises(sim_nvml.NVMLError_Uninitialized):
        sim_nvml.nvmlDeviceGetCount()


def test_a_failing_nvml_read_is_an_infrastructure_error(gpu_host: GpuHost) -> None:
    monitor = NvmlMonitor(sim_nvml, [0])
    sim_nvml.nvmlShutdown()  # the session vanishes under the monitor, like a lost driver
    try:
        with pytest.raises(MonitorError, match="NVML memory query failed: Uninitialized") as info:
            monitor.sample()
        assert isinstance(info.value, InfrastructureError)
    finally:
        monitor.close()  # tolerates the shutdown that already happened
