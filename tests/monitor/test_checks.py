"""Launch checks over simulated GPUs: who else holds memory, and when the last engine's memory is gone."""

from __future__ import annotations

import time
from collections.abc import Callable

from autotuner.monitor import NvmlMonitor, busy_devices, wait_for_release, wait_until
from autotuner.monitor.base import DeviceInfo, MemoryMonitor
from autotuner.sim.worker_pool import WorkerPool
from tests.support.sim_gpus import GIB

OpenMonitor = Callable[[list[int] | None], NvmlMonitor]
StartPool = Callable[[list[int]], WorkerPool]
MIB = 1 << 20


def test_wait_for_release_sees_memory_freed_shortly_after_the_workers_exit(
    open_sim_monitor: OpenMonitor, start_pool: StartPool
) -> None:
    monitor = open_sim_monitor([0, 1])
    baseline = monitor.sample()
    pool = start_pool([0, 1])
    pool.set_bytes([3 * GIB, 5 * GIB])
    pool.stop()  # exited; the simulated driver frees the memory ~0.5 s later
    started = time.perf_counter()
    assert monitor.sample() == [3 * GIB, 5 * GIB]
    assert wait_for_release(monitor, baseline, tolerance_bytes=0, timeout=5.0)
    waited = time.perf_counter() - started
    assert 0.2 < waited < 2.0
    assert monitor.sample() == baseline


def test_wait_for_release_times_out_while_memory_is_held(
    open_sim_monitor: OpenMonitor, start_pool: StartPool
) -> None:
    monitor = open_sim_monitor([0, 1])
    baseline = monitor.sample()
    start_pool([1]).set_bytes([GIB])
    started = time.perf_counter()
    assert not wait_for_release(monitor, baseline, tolerance_bytes=512 * MIB, timeout=0.3)
    assert time.perf_counter() - started >= 0.3
    # Within tolerance counts as released.
    assert wait_for_release(monitor, baseline, tolerance_bytes=GIB, timeout=0.0)


def test_wait_until_checks_at_least_once() -> None:
    class Calls:
        n = 0

    class Once(NvmlMonitor):
        def __init__(self) -> None:  # no NVML: only sample() is used
            pass

        def sample(self) -> list[int]:
            Calls.n += 1
            return [0]

    assert wait_until(Once(), lambda used: used == [0], timeout=0.0)
    assert not wait_until(Once(), lambda used: used == [1], timeout=0.0)
    assert Calls.n == 2


def test_busy_devices_names_the_other_processes_on_each_gpu(
    open_sim_monitor: OpenMonitor, start_pool: StartPool
) -> None:
    monitor = open_sim_monitor([0, 2, 5])
    assert busy_devices(monitor) == {}
    stranger, ours = start_pool([5, 2]), start_pool([0])
    stranger.set_bytes([2 * GIB, GIB])
    ours.set_bytes([3 * GIB])
    assert busy_devices(monitor) == {
        0: [(ours.pids[0], 3 * GIB)],
        2: [(stranger.pids[1], GIB)],
        5: [(stranger.pids[0], 2 * GIB)],
    }
    assert busy_devices(monitor, ignore_pids=ours.pids) == {
        2: [(stranger.pids[1], GIB)],
        5: [(stranger.pids[0], 2 * GIB)],
    }



class _TwoDevices(MemoryMonitor):
    """An engine tree that has let go, and a shared device that the rest of the box keeps growing."""

    def __init__(self, shared: bool) -> None:
        self.info = [DeviceInfo(0, "tree", "tree", 8 * GIB), DeviceInfo(1, "ram", "ram", 8 * GIB, shared=shared)]
        self.ram = GIB + 512 * MIB

    def devices(self) -> list[DeviceInfo]:
        return list(self.info)

    def sample(self) -> list[int]:
        self.ram += 64 * MIB
        return [0, self.ram]

    def processes(self, position: int) -> list[tuple[int, int]]:
        return []

    def close(self) -> None:
        pass


def test_a_shared_device_moved_by_the_rest_of_the_box_does_not_hold_up_the_release() -> None:
    """On the host monitor the engine's release is its process tree's; host RAM is shared with everything
    else, and another job's growth must not make every trial wait out its timeout."""
    from autotuner.monitor.host import HostMonitor

    assert [d.shared for d in HostMonitor(None).devices()] == [False, True]
    shared = _TwoDevices(shared=True)
    started = time.perf_counter()
    assert wait_for_release(shared, [0, GIB], tolerance_bytes=256 * MIB, timeout=5.0)
    assert time.perf_counter() - started < 1.0
    # The same growth on a device of its own is memory not released.
    assert not wait_for_release(_TwoDevices(shared=False), [0, GIB], tolerance_bytes=256 * MIB, timeout=0.3)
