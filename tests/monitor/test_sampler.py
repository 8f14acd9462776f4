"""The background sampler over simulated GPUs held by real workers, and over small fake monitors."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from autotuner.monitor import (
    DeviceInfo,
    MemoryMonitor,
    MonitorError,
    NvmlMonitor,
    Sampler,
    Threshold,
    ThresholdEvent,
)
from autotuner.sim import nvml as sim_nvml
from autotuner.sim.gpu_state import GpuHost
from autotuner.sim.worker_pool import WorkerPool
from tests.support.sim_gpus import GIB, GPU_TOTAL

OpenMonitor = Callable[[list[int] | None], NvmlMonitor]
StartPool = Callable[[list[int]], WorkerPool]
MIB = 1 << 20


class ScriptedMonitor(MemoryMonitor):
    """A fake device whose reads cost ``cost_s`` (``slow_s`` on call ``slow_call``); logs each call's time."""

    def __init__(self, cost_s: float = 0.0, slow_call: int = -1, slow_s: float = 0.0) -> None:
        self.cost_s, self.slow_call, self.slow_s = cost_s, slow_call, slow_s
        self.calls: list[float] = []
        self.value = 0

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(0, "fake", "fake-0", 100)]

    def sample(self) -> list[int]:
        self.calls.append(time.perf_counter())
        cost = self.slow_s if len(self.calls) == self.slow_call else self.cost_s
        if cost:
            time.sleep(cost)
        return [self.value]

    def processes(self, position: int) -> list[tuple[int, int]]:
        return []

    def close(self) -> None:
        pass


def run_for(sampler: Sampler, seconds: float, action: Callable[[], None] | None = None) -> None:
    sampler.start()
    try:
        if action is not None:
            action()
        time.sleep(seconds)
    except BaseException:
        sampler.stop()
        raise


def test_sampler_reaches_its_rate_on_simulated_gpus(open_sim_monitor: OpenMonitor, start_pool: StartPool) -> None:
    start_pool([0, 1]).set_bytes([GIB, 2 * GIB])
    sampler = Sampler(open_sim_monitor([0, 1]), hz=100.0)
    run_for(sampler, 1.0)
    summary = sampler.stop()
    print(f"achieved {summary.sample_hz:.1f} Hz, {summary.samples} samples in {summary.duration_s:.3f} s")
    assert summary.sample_hz >= 50  # the 100 Hz target itself is measured in benchmarks/sampler.py
    assert summary.sample_hz <= 101  # a deadline schedule never runs ahead of the grid
    assert summary.samples >= 50
    assert summary.peak_bytes == summary.baseline_bytes == [GIB, 2 * GIB]


def test_summary_records_the_peak_of_a_memory_step(open_sim_monitor: OpenMonitor, start_pool: StartPool) -> None:
    pool = start_pool([3, 4])
    pool.set_bytes([GIB, 2 * GIB])
    sampler = Sampler(open_sim_monitor([3, 4]), hz=100.0)
    sampler.start()
    try:
        time.sleep(0.1)
        pool.set_bytes([9 * GIB, 4 * GIB])
        time.sleep(0.15)
        pool.set_bytes([GIB, GIB])
        time.sleep(0.1)
    finally:
        summary = sampler.stop()
    assert summary.baseline_bytes == [GIB, 2 * GIB]
    assert summary.peak_bytes == [9 * GIB, 4 * GIB]
    assert summary.total_bytes == [GPU_TOTAL, GPU_TOTAL]
    assert summary.peak_fraction == pytest.approx(9 / 24)
    assert summary.threshold_event is None
    assert [d.index for d in summary.devices] == [3, 4]
    times = [t for t, _ in summary.timeline]
    assert times[0] == 0.0 and times == sorted(times)
    assert [max(v[i] for _, v in summary.timeline) for i in (0, 1)] == [9 * GIB, 4 * GIB]
    assert summary.timeline[-1][1] == [GIB, GIB]


def test_threshold_fires_once_from_the_sampler_thread_soon_after_the_crossing(
    open_sim_monitor: OpenMonitor, start_pool: StartPool
) -> None:
    pool = start_pool([6, 7])
    pool.set_bytes([GIB, GIB])
    fired: list[tuple[ThresholdEvent, float, str]] = []
    sampler = Sampler(
        open_sim_monitor([6, 7]),
        hz=100.0,
        threshold=Threshold.of_total(0.9),
        on_threshold=lambda e: fired.append((e, time.perf_counter(), threading.current_thread().name)),
    )
    latencies = []
    for _ in range(5):  # five runs of one sampler: each run fires on its own
        fired.clear()
        sampler.start()
        try:
            time.sleep(random.uniform(0.05, 0.06))  # a random phase against the 10 ms grid
            assert fired == []
            pool.set_bytes([GIB, 22 * GIB])
            visible = time.perf_counter()  # the worker acked: NVML shows it from now on
            deadline = visible + 1.0
            while not fired and time.perf_counter() < deadline:
                time.sleep(0.001)
            assert fired, "the crossing was not reported within 1 s"
            pool.set_bytes([GIB, GIB])
            pool.set_bytes([23 * GIB, 23 * GIB])  # a second crossing in the same run
            time.sleep(0.05)
        finally:
            summary = sampler.stop()
            pool.set_bytes([GIB, GIB])
        assert len(fired) == 1
        event, at, thread = fired[0]
        assert thread == "memory-sampler"
        limit = int(GPU_TOTAL * 0.9)
        assert (event.position, event.index, event.used_bytes, event.total_bytes, event.limit_bytes) == (
            1, 7, 22 * GIB, GPU_TOTAL, limit,
        )  # fmt: skip
        assert summary.threshold_event == event
        assert summary.peak_bytes == [23 * GIB, 23 * GIB]  # sampling went on after the callback
        latencies.append(at - visible)
    print("threshold latency ms:", [round(x * 1000, 1) for x in latencies])
    # Typically within a couple of 10 ms periods (measured in benchmarks/sampler.py); the bound here is
    # one that holds on a loaded 2-core box and still tells "reported by the sampler" from "not at all".
    assert max(latencies) < 0.5


def test_min_free_threshold_counts_from_the_top(open_sim_monitor: OpenMonitor, start_pool: StartPool) -> None:
    pool = start_pool([0])
    pool.set_bytes([22 * GIB + 512 * MIB])
    fired: list[ThresholdEvent] = []
    sampler = Sampler(
        open_sim_monitor([0]), hz=100.0, threshold=Threshold.min_free(1024), on_threshold=fired.append
    )
    sampler.start()
    try:
        time.sleep(0.05)
        assert fired == []
        pool.set_bytes([23 * GIB])
        deadline = time.monotonic() + 5.0
        while not fired and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # a few more samples above the limit: still one event
    finally:
        sampler.stop()
    assert [(e.used_bytes, e.limit_bytes) for e in fired] == [(23 * GIB, 23 * GIB)]


def test_threshold_arguments_and_limits() -> None:
    assert Threshold().limit_bytes(1000) == 970
    assert Threshold.of_total(0.5).limit_bytes(1000) == 500
    assert Threshold.min_free(1).limit_bytes(3 * MIB) == 2 * MIB
    assert Threshold.min_free(10).limit_bytes(3 * MIB) == 0
    with pytest.raises(ValueError, match="exactly one"):
        Threshold(fraction=0.9, min_free_mib=100)
    with pytest.raises(ValueError, match="exactly one"):
        Threshold(fraction=None)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Threshold.of_total(1.5)


def test_the_schedule_never_runs_ahead_of_its_rate_despite_read_costs() -> None:
    monitor = ScriptedMonitor(cost_s=0.002)  # a sleep-after-each-read loop would drift 2 ms a sample
    sampler = Sampler(monitor, hz=100.0)
    run_for(sampler, 1.0)
    sampler.stop()
    # Never ahead of the grid (a deadline schedule does not burst); the phase error itself is timing,
    # measured in benchmarks/sampler.py, and the lower bound is one a loaded 2-core box keeps.
    assert 30 <= len(monitor.calls) <= 102


def test_an_overrun_skips_ahead_instead_of_bursting() -> None:
    monitor = ScriptedMonitor(slow_call=5, slow_s=0.055)  # 5.5 periods in one read
    sampler = Sampler(monitor, hz=100.0)
    run_for(sampler, 0.3)
    sampler.stop()
    assert monitor.calls[5] - monitor.calls[4] >= 0.055
    # Catching up would read the 5 missed slots back to back after the slow one; skipping ahead reads each
    # grid slot at most once. n reads in distinct slots span more than n − 2 periods, however late the box
    # wakes the thread (a wake-up late in one slot can land the next read right after it: no gap to test).
    after = monitor.calls[5:]
    assert len(after) >= 10
    assert len(after) <= (after[-1] - after[0]) / 0.01 + 2, after


def test_a_failing_callback_does_not_stop_sampling() -> None:
    monitor = ScriptedMonitor()
    monitor.value = 99

    def boom(event: ThresholdEvent) -> None:
        raise RuntimeError("the stop path broke")

    sampler = Sampler(monitor, hz=100.0, threshold=Threshold.of_total(0.5), on_threshold=boom)
    run_for(sampler, 0.2)
    summary = sampler.stop()
    assert summary.threshold_event is not None and summary.threshold_event.t_s == 0.0
    assert summary.samples >= 10


def test_a_monitor_that_stops_working_fails_the_run(gpu_host: GpuHost) -> None:
    monitor = NvmlMonitor(sim_nvml, [0])
    try:
        sampler = Sampler(monitor, hz=100.0)
        sampler.start()
        sim_nvml.nvmlShutdown()  # the driver goes away mid-run
        deadline = time.monotonic() + 2.0
        while sampler.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(sampler.failure, MonitorError)
        with pytest.raises(MonitorError, match="memory sampling failed during the run"):
            sampler.stop()
        assert not sampler.running
    finally:
        monitor.close()


def test_start_and_stop_misuse() -> None:
    sampler = Sampler(ScriptedMonitor(), hz=50.0)
    with pytest.raises(RuntimeError, match="not running"):
        sampler.stop()
    sampler.start()
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start()
    sampler.stop()
    with pytest.raises(ValueError, match="positive"):
        Sampler(ScriptedMonitor(), hz=0)


def test_a_live_view_set_in_the_context_hears_the_peaks_so_far() -> None:
    from autotuner.monitor.sampler import LISTENER_PERIOD_S, memory_listener

    heard: list[tuple[str, dict[str, object]]] = []
    monitor = ScriptedMonitor()
    monitor.value = 40
    token = memory_listener.set(lambda kind, data: heard.append((kind, data)))
    try:
        sampler = Sampler(monitor, hz=200.0, threshold=Threshold.of_total(0.9))
    finally:
        memory_listener.reset(token)
    sampler.start()
    monitor.value = 70
    time.sleep(3 * LISTENER_PERIOD_S)
    monitor.value = 50
    sampler.stop()
    assert heard[0] == ("memory", {"used_bytes": [40], "peak_bytes": [40], "total_bytes": [100],
                                   "limit_bytes": [90], "gpus": [0]})
    assert ("memory", {"used_bytes": [70], "peak_bytes": [70], "total_bytes": [100], "limit_bytes": [90],
                       "gpus": [0]}) in heard
    assert len(heard) <= 6  # a few times a second (start, then every period), not at each of ~150 samples
