"""open_monitor picks the backend the scenario names; auto falls back to host memory without NVML."""

from __future__ import annotations

import os

import pynvml
import pytest

from autotuner.monitor import (
    HostMonitor,
    MonitorConfigError,
    NvmlMonitor,
    NvmlUnavailableError,
    open_monitor,
)
from autotuner.sim.gpu_state import GpuHost
from autotuner.sim.worker_pool import WorkerPool
from tests.support.sim_gpus import GIB


def real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_sim_opens_the_simulated_gpus(gpu_host: GpuHost) -> None:
    with WorkerPool(gpu_host.state_dir, [3]) as pool, open_monitor("sim", [1, 3]) as monitor:
        pool.set_bytes([2 * GIB])
        assert isinstance(monitor, NvmlMonitor)
        assert [d.index for d in monitor.devices()] == [1, 3]
        assert monitor.sample() == [0, 2 * GIB]


def test_sim_with_a_bad_index_is_a_user_error(gpu_host: GpuHost) -> None:
    with pytest.raises(MonitorConfigError, match="GPU index 9 does not exist: this machine has 8 GPUs"):
        open_monitor("sim", [9])


def test_host_watches_the_given_process_tree() -> None:
    with open_monitor("host", None, root_pid=os.getpid()) as monitor:
        assert isinstance(monitor, HostMonitor)
        tree, host = monitor.sample()
        assert 0 < tree <= host


@pytest.mark.skipif(real_nvml_works(), reason="this machine has a working NVML")
def test_without_nvml_auto_falls_back_to_host_and_nvml_says_why() -> None:
    with open_monitor("auto", [0], root_pid=os.getpid()) as monitor:
        assert isinstance(monitor, HostMonitor)
    with pytest.raises(NvmlUnavailableError, match=r"^NVML not available: .+; use monitor: host or sim$"):
        open_monitor("nvml", [0])


@pytest.mark.skipif(not real_nvml_works(), reason="needs a working NVML")
def test_with_nvml_auto_uses_it() -> None:
    with open_monitor("auto", None) as monitor:
        assert isinstance(monitor, NvmlMonitor)
        assert len(monitor.sample()) == len(monitor.devices()) > 0


def test_an_unknown_kind_is_a_user_error() -> None:
    with pytest.raises(MonitorConfigError, match="unknown memory monitor 'gpu'"):
        open_monitor("gpu", None)  # type: ignore[arg-type]
