"""The memory-monitor contract: what the sampler, the trial and the GPU checks may rely on from any
`MemoryMonitor`, as `open_monitor` hands it out for the scenario's `monitor.kind`.

Run over every implementation: `NvmlMonitor` over the simulated NVML (`sim`, memory held by real simulated
worker processes), `HostMonitor` (`host`: the engine's process tree RSS and the host's RAM, memory held by a
real child process) and `NvmlMonitor` over the real pynvml (`nvml`: skipped, saying why, where NVML or a
driver is absent; its allocation clauses need torch with CUDA to hold GPU memory). The clauses:

- `devices()` is a fixed, non-empty list (a copy each call) of devices with distinct indices and UUIDs and
  positive totals;
- `sample()` is one non-negative int per device, never above the device's total, fast enough for the
  sampler's 100 Hz, and safe on a sampler thread while `processes()` runs on another;
- `processes(position)` is sorted, distinct (pid, bytes) pairs of ints; a position outside 0..n-1 is an
  IndexError;
- memory a process holds shows in `sample()` at its device and names the process in `processes()`; once the
  process is gone, both let go of it;
- `close()` ends the backend's session, is idempotent, and the context manager calls it; two monitors open
  side by side do not share a fate (closing one leaves the other reading).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from autotuner.monitor import MemoryMonitor, NvmlUnavailableError, open_monitor
from autotuner.sim import nvml as sim_nvml
from autotuner.sim.gpu_state import GpuHost, make_gpus
from autotuner.sim.worker_pool import WorkerPool
from tests.support.waiting import wait_for

MIB = 1 << 20
GIB = 1 << 30
KINDS = ["sim", "host", "nvml"]
SAMPLER_PERIOD_S = 0.01  # the sampler's 100 Hz (monitor/sampler.py)

# Known bugs (each a clause one implementation breaks; see the report of this suite).
# A process that allocates on request (one line: the byte count) and holds it until killed.
HOLDER = """
import sys
{setup}
held = []
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    held.append({alloc})
    print("ok", flush=True)
"""
HOST_ALLOC = ("", 'b"\\x01" * n')  # bytes * n fills every page (a calloc'd bytearray would not be resident)
CUDA_ALLOC = ("import torch", 'torch.ones(n, dtype=torch.uint8, device="cuda")')


class Holder(Protocol):
    """A process of ours that holds memory on the monitored device."""

    pid: int

    def hold(self, nbytes: int) -> None: ...
    def release(self) -> None: ...


class ChildHolder:
    """A real child process (its own process group) that allocates when told to; released = killed."""

    def __init__(self, setup: str, alloc: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(setup=setup, alloc=alloc)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready", "the holder did not start"

    def hold(self, nbytes: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{nbytes}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", "the holder could not allocate"

    def release(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()


class SimWorkerHolder:
    """A simulated TP worker (a real process) holding memory on one simulated GPU; released = stopped."""

    def __init__(self, state_dir: Path, gpu: int) -> None:
        self.pool = WorkerPool(state_dir, [gpu])
        self.pool.start()
        self.pid = self.pool.pids[0]

    def hold(self, nbytes: int) -> None:
        self.pool.set_bytes([nbytes])

    def release(self) -> None:
        self.pool.stop()


@dataclass
class Watched:
    """One implementation set up for a test: the monitor, how to open another like it, the device position
    a holder's memory shows at, how to start a holder and how much it holds, and whether the backend's
    session is still open (None where there is no session to observe, as for host memory)."""

    kind: str
    monitor: MemoryMonitor
    reopen: Callable[[], MemoryMonitor]
    position: int
    start_holder: Callable[[], Holder]
    hold_bytes: int
    session_open: Callable[[], bool] | None


def _nvml_session_open(module: object) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            module.nvmlDeviceGetCount()  # type: ignore[attr-defined]
        except module.NVMLError_Uninitialized:  # type: ignore[attr-defined]
            return False
        return True

    return probe


@pytest.fixture(params=KINDS)
def watched(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Watched]:
    """Every monitor implementation, opened through `open_monitor` as the trial opens it."""
    kind = str(request.param)
    holders: list[Holder] = []
    opened: list[MemoryMonitor] = []

    def track(holder: Holder) -> Holder:
        holders.append(holder)
        return holder

    def opening(make: Callable[[], MemoryMonitor]) -> Callable[[], MemoryMonitor]:
        def reopen() -> MemoryMonitor:
            monitor = make()
            opened.append(monitor)
            return monitor

        return reopen

    if kind == "sim":
        state_dir: Path = request.getfixturevalue("state_dir")  # a private simulated box
        GpuHost(state_dir).ensure_inventory(make_gpus(state_dir, "NVIDIA GeForce RTX 3090", 24 * GIB, 4))
        reopen = opening(lambda: open_monitor("sim", None))
        setup = Watched(kind, reopen(), reopen, 1, lambda: track(SimWorkerHolder(state_dir, 1)), 3 * GIB,
                        _nvml_session_open(sim_nvml))
    elif kind == "host":
        # The engine's tree is rooted at the holder, which exists only while a test has started one.
        root: list[int | None] = [None]

        def host_holder() -> Holder:
            holder = track(ChildHolder(*HOST_ALLOC))
            root[0] = holder.pid
            return holder

        reopen = opening(lambda: open_monitor("host", None, root_pid=lambda: root[0]))
        setup = Watched(kind, reopen(), reopen, 0, host_holder, 100 * MIB, None)
    else:
        try:
            import pynvml
        except ImportError as exc:
            pytest.skip(f"real NVML: the pynvml module is missing ({exc})")
        try:
            first = open_monitor("nvml", None)
        except NvmlUnavailableError as exc:
            pytest.skip(f"real NVML is not available on this machine (no GPU or driver): {exc}")
        opened.append(first)
        gpu = first.devices()[0].index

        def cuda_holder() -> Holder:
            if importlib.util.find_spec("torch") is None:
                pytest.skip("holding real GPU memory needs torch with CUDA, which is not installed")
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
            return track(ChildHolder(*CUDA_ALLOC, env=env))

        setup = Watched(kind, first, opening(lambda: open_monitor("nvml", None)), 0, cuda_holder, GIB,
                        _nvml_session_open(pynvml))
    try:
        yield setup
    finally:
        for holder in holders:
            holder.release()
        for monitor in opened:
            monitor.close()


def _check_sample(monitor: MemoryMonitor, values: list[int]) -> None:
    devices = monitor.devices()
    assert len(values) == len(devices)
    for value, device in zip(values, devices, strict=True):
        assert type(value) is int, value
        assert 0 <= value <= device.total_bytes, (device, value)


def _check_processes(pairs: list[tuple[int, int]]) -> None:
    for pid, nbytes in pairs:
        assert type(pid) is int and pid > 0, pairs
        assert type(nbytes) is int and nbytes >= 0, pairs
    pids = [pid for pid, _ in pairs]
    assert pids == sorted(set(pids)), pairs


# --- devices and readings --------------------------------------------------------------------------------


def test_devices_are_a_fixed_nonempty_list(watched: Watched) -> None:
    devices = watched.monitor.devices()
    assert devices
    assert all(d.total_bytes > 0 and d.name and d.uuid for d in devices), devices
    assert len({d.index for d in devices}) == len(devices)
    assert len({d.uuid for d in devices}) == len(devices)
    devices.clear()  # a caller's copy: the monitor's list stays
    assert watched.monitor.devices() == watched.reopen().devices() != []


def test_a_sample_is_one_reading_per_device_within_its_total(watched: Watched) -> None:
    holder = watched.start_holder()
    holder.hold(watched.hold_bytes)
    for _ in range(5):
        _check_sample(watched.monitor, watched.monitor.sample())


def test_a_sample_is_fast_enough_for_the_100_hz_sampler(watched: Watched) -> None:
    watched.start_holder().hold(watched.hold_bytes)
    durations = []
    for _ in range(50):
        t = time.perf_counter()
        watched.monitor.sample()
        durations.append(time.perf_counter() - t)
    assert statistics.median(durations) < SAMPLER_PERIOD_S, durations


def test_processes_are_sorted_pid_byte_pairs(watched: Watched) -> None:
    holder = watched.start_holder()
    holder.hold(watched.hold_bytes)
    for position in range(len(watched.monitor.devices())):
        _check_processes(watched.monitor.processes(position))


def test_a_position_past_the_last_device_is_an_index_error(watched: Watched) -> None:
    with pytest.raises(IndexError):
        watched.monitor.processes(len(watched.monitor.devices()))


def test_a_negative_position_is_an_index_error(watched: Watched) -> None:
    """Positions are 0..n-1 (monitor/base.py); -1 is a caller's bug, not "the last GPU"."""
    with pytest.raises(IndexError):
        watched.monitor.processes(-1)


def test_sampling_on_a_thread_while_processes_is_asked(watched: Watched) -> None:
    """The sampler reads on its own thread while the trial asks who holds what (monitor/base.py)."""
    watched.start_holder().hold(watched.hold_bytes)
    monitor = watched.monitor
    failures: list[BaseException] = []
    readings: list[list[int]] = []

    def sampler() -> None:
        try:
            for _ in range(100):
                readings.append(monitor.sample())
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=sampler)
    thread.start()
    for _ in range(20):
        _check_processes(monitor.processes(watched.position))
    thread.join(timeout=30)
    assert not thread.is_alive() and failures == []
    assert len(readings) == 100
    for values in readings:
        _check_sample(monitor, values)


# --- memory that a process holds -------------------------------------------------------------------------


def test_held_memory_shows_in_the_sample_and_names_its_holder(watched: Watched) -> None:
    monitor, at, amount = watched.monitor, watched.position, watched.hold_bytes
    before = monitor.sample()[at]
    holder = watched.start_holder()
    holder.hold(amount)
    wait_for(lambda: monitor.sample()[at] - before >= amount * 0.9, timeout=5,
             what=f"{amount} bytes more at position {at}")
    held = dict(monitor.processes(at))
    assert held.get(holder.pid, 0) >= amount * 0.9, held


def test_memory_of_a_process_that_is_gone_is_let_go(watched: Watched) -> None:
    monitor, at, amount = watched.monitor, watched.position, watched.hold_bytes
    before = monitor.sample()[at]
    holder = watched.start_holder()
    holder.hold(amount)
    wait_for(lambda: monitor.sample()[at] - before >= amount * 0.9, timeout=5, what="the holder's memory")
    holder.release()
    wait_for(lambda: monitor.sample()[at] <= before + amount * 0.1, timeout=5,
             what="the memory of the exited holder to be released")
    wait_for(lambda: holder.pid not in dict(monitor.processes(at)), timeout=5,
             what="the exited holder to leave processes()")


# --- the backend's session -------------------------------------------------------------------------------


def test_the_context_manager_closes_and_close_is_idempotent(watched: Watched) -> None:
    monitor = watched.monitor
    if watched.session_open is not None:
        assert watched.session_open()
    with monitor as entered:
        assert entered is monitor
        _check_sample(monitor, monitor.sample())
    if watched.session_open is not None:
        assert not watched.session_open(), "the NVML session outlived the monitor"
    monitor.close()
    monitor.close()


def test_two_monitors_side_by_side_close_independently(watched: Watched) -> None:
    """The trial's monitor and a check's (busy GPUs, headroom) are open at once; closing one must not end
    the other's session (NVML's init is refcounted)."""
    other = watched.reopen()
    other.close()
    _check_sample(watched.monitor, watched.monitor.sample())
    assert watched.monitor.devices() == other.devices()
    if watched.session_open is not None:
        assert watched.session_open()
