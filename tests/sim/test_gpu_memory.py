"""Simulated GPU memory as NVML shows it: held by real processes, released shortly after they exit.

Real worker processes, real files, the simulator's pynvml drop-in; each test has its own state dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from autotuner.sim import nvml
from autotuner.sim.gpu_state import (
    HOLDERS_DIR,
    STATE_DIR_ENV,
    GpuHost,
    GpuInventoryConflict,
    Holder,
    SimGpu,
    default_state_dir,
    make_gpus,
    write_holder,
)
from autotuner.sim.worker_pool import SimWorkerError, WorkerPool
from autotuner.sim.worker_process import ORPHAN_TIMEOUT_ENV
from tests.support.waiting import seconds_until, wait_for

GIB = 1 << 30
RTX_3090 = "NVIDIA GeForce RTX 3090"
REPO_ROOT = Path(__file__).resolve().parents[2]

# A server stand-in: starts two workers, makes them hold memory, then idles until killed.
PARENT_SCRIPT = """
import sys, time
from pathlib import Path
from autotuner.sim.worker_pool import WorkerPool
pool = WorkerPool(Path(sys.argv[1]), [0, 1])
pool.start()
pool.set_bytes([3 << 30, 5 << 30])
time.sleep(120)
"""


@pytest.fixture
def host(state_dir: Path) -> GpuHost:
    h = GpuHost(state_dir)
    h.ensure_inventory(make_gpus(state_dir, RTX_3090, 24 * GIB, 2))
    return h


@pytest.fixture
def smi(host: GpuHost) -> Iterator[ModuleType]:
    """The simulator's pynvml, initialised on this test's GPUs."""
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


@pytest.fixture
def pool(host: GpuHost) -> Iterator[WorkerPool]:
    p = WorkerPool(host.state_dir, [0, 1])
    p.start()
    try:
        yield p
    finally:
        p.stop()


def used(index: int) -> int:
    return nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).used




def killpg_quietly(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


# ---- inventory


def test_default_state_dir_follows_xdg_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_state_dir() == tmp_path / f"autotuner-sim-gpus-{os.getuid()}"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_state_dir() == Path("/tmp") / f"autotuner-sim-gpus-{os.getuid()}"


def test_inventory_is_written_and_uuids_are_nvml_shaped_and_per_state_dir(
    state_dir: Path, tmp_path: Path
) -> None:
    h = GpuHost(state_dir)
    assert h.inventory() == []
    gpus = make_gpus(state_dir, RTX_3090, 24 * GIB, 8)
    h.ensure_inventory(gpus)

    assert h.inventory() == gpus
    raw = json.loads((state_dir / "inventory.json").read_text())
    assert raw["gpus"][7] == {
        "index": 7, "name": RTX_3090, "uuid": gpus[7].uuid, "memory_total_bytes": 24 * GIB,
    }  # fmt: skip
    uuids = [g.uuid for g in gpus]
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids
    )
    assert len(set(uuids)) == 8
    assert make_gpus(state_dir, RTX_3090, 24 * GIB, 8) == gpus  # deterministic
    other = make_gpus(tmp_path / "elsewhere", RTX_3090, 24 * GIB, 8)
    assert not set(uuids) & {g.uuid for g in other}


def test_different_inventory_replaces_the_old_one_when_nothing_is_held(host: GpuHost) -> None:
    h100 = make_gpus(host.state_dir, "NVIDIA H100 80GB HBM3", 80 * GIB, 4)
    host.ensure_inventory(h100)
    assert host.inventory() == h100


def test_different_inventory_conflicts_while_memory_is_held(host: GpuHost, pool: WorkerPool) -> None:
    pool.set_bytes([GIB, 2 * GIB])
    before = host.inventory()
    host.ensure_inventory(before)  # identical: fine while in use

    with pytest.raises(GpuInventoryConflict) as info:
        host.ensure_inventory([SimGpu(0, "NVIDIA A10", "GPU-00000000-0000-0000-0000-000000000000", 24 * GIB)])

    assert sorted(info.value.pids) == sorted(pool.pids)
    assert all(str(pid) in str(info.value) for pid in pool.pids)
    assert host.inventory() == before


# ---- memory held by worker processes, seen through nvml


def test_workers_memory_shows_per_gpu_in_nvml(smi: ModuleType, host: GpuHost, pool: WorkerPool) -> None:
    pool.set_bytes([3 * GIB, 5 * GIB])

    assert smi.nvmlDeviceGetCount() == 2
    assert smi.nvmlSystemGetDriverVersion() == "550.00-sim"
    for index, held in enumerate([3 * GIB, 5 * GIB]):
        handle = smi.nvmlDeviceGetHandleByIndex(index)
        assert smi.nvmlDeviceGetName(handle) == RTX_3090
        assert smi.nvmlDeviceGetUUID(handle) == host.inventory()[index].uuid
        mem = smi.nvmlDeviceGetMemoryInfo(handle)
        assert (mem.total, mem.used, mem.free) == (24 * GIB, held, 24 * GIB - held)
        procs = smi.nvmlDeviceGetComputeRunningProcesses(handle)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(pool.pids[index], held)]
    assert [h.name for h in host.holders(1)] == ["VLLM::Worker_TP1"]


def test_set_bytes_is_visible_at_once(smi: ModuleType, pool: WorkerPool) -> None:
    pool.set_bytes([3 * GIB, 5 * GIB])
    pool.set_bytes([7 * GIB, 0])
    assert (used(0), used(1)) == (7 * GIB, 0)
    pool.set_bytes([GIB, 30 * GIB])  # more than the GPU has: NVML cannot show more than total
    assert (used(0), used(1)) == (GIB, 24 * GIB)
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(1)).free == 0


def test_stop_releases_memory_shortly_after_the_workers_exit(
    smi: ModuleType, host: GpuHost, pool: WorkerPool
) -> None:
    pool.set_bytes([3 * GIB, 5 * GIB])
    pids = pool.pids
    pool.stop()
    assert not any(psutil.pid_exists(p) for p in pids)
    # Dead, but the driver has not released it yet.
    assert (used(0), used(1)) == (3 * GIB, 5 * GIB)

    wait_for(lambda: used(0) == 0 and used(1) == 0, timeout=2.0)
    assert smi.nvmlDeviceGetComputeRunningProcesses(smi.nvmlDeviceGetHandleByIndex(0)) == []
    assert list((host.state_dir / HOLDERS_DIR).glob("gpu*.json")) == []  # readers cleaned up


def test_a_dead_worker_is_reported_and_its_memory_released(smi: ModuleType, pool: WorkerPool) -> None:
    pool.set_bytes([2 * GIB, 2 * GIB])
    victim = psutil.Process(pool.pids[1])
    victim.kill()
    victim.wait(5)

    with pytest.raises(SimWorkerError, match=f"rank 1 pid {victim.pid}"):
        pool.set_bytes([GIB, GIB])
    wait_for(lambda: used(1) == 0, timeout=2.0)
    assert used(0) == GIB  # the live worker applied its update


def test_a_stopped_worker_still_holds_memory_without_heartbeats(smi: ModuleType, pool: WorkerPool) -> None:
    pool.set_bytes([2 * GIB, 3 * GIB])
    os.kill(pool.pids[1], signal.SIGSTOP)  # alive, but its heartbeat thread is frozen too
    try:
        time.sleep(1.2)
        assert used(1) == 3 * GIB
        os.kill(pool.pids[1], signal.SIGKILL)
        wait_for(lambda: used(1) == 0, timeout=2.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pool.pids[1], signal.SIGCONT)


def test_an_unreaped_zombie_holds_nothing(smi: ModuleType, pool: WorkerPool) -> None:
    pool.set_bytes([2 * GIB, 3 * GIB])
    os.kill(pool.pids[0], signal.SIGKILL)  # not waited for: it stays a zombie child of this process
    wait_for(lambda: psutil.Process(pool.pids[0]).status() == psutil.STATUS_ZOMBIE, timeout=2.0)

    wait_for(lambda: used(0) == 0, timeout=2.0)
    assert psutil.Process(pool.pids[0]).status() == psutil.STATUS_ZOMBIE  # the PID still exists
    assert used(1) == 3 * GIB


def test_a_reused_pid_does_not_keep_a_dead_holders_memory(host: GpuHost) -> None:
    """Files written by hand for this (live) test process: only the create_time tells them apart."""
    me = psutil.Process()
    long_ago = time.time() - 60  # far past the release delay: only liveness can count
    stale = write_holder(
        host.state_dir, gpu=0, pid=me.pid, create_time=me.create_time() - 100, nbytes=GIB, name="old"
    )
    os.utime(stale, (long_ago, long_ago))
    assert host.used_bytes(0) == 0
    assert not stale.exists()  # a reader cleaned it up

    live = write_holder(
        host.state_dir, gpu=1, pid=me.pid, create_time=me.create_time(), nbytes=GIB, name="me"
    )
    os.utime(live, (long_ago, long_ago))
    assert host.used_bytes(1) == GIB
    assert host.holders(1) == [Holder(pid=me.pid, gpu=1, bytes=GIB, name="me")]


def test_a_bad_byte_count_is_refused(pool: WorkerPool) -> None:
    with pytest.raises(SimWorkerError, match=r"rank 0 pid \d+ answered \"error bad byte count '-1'\"$"):
        pool.set_bytes([-1, 0])
    pool.set_bytes([GIB, 2 * GIB])  # rank 1's ack of the bad round was consumed, not left behind


def test_workers_exit_when_the_state_dir_disappears(host: GpuHost, pool: WorkerPool) -> None:
    pool.set_bytes([GIB, GIB])
    procs = [psutil.Process(p) for p in pool.pids]
    shutil.rmtree(host.state_dir)
    gone, alive = psutil.wait_procs(procs, timeout=3.0)
    assert alive == []
    assert all(p.returncode == 0 for p in gone)


# ---- a SIGKILLed server leaves orphaned workers that keep holding memory


def start_server_standin(state_dir: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )
    return subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(state_dir)],
        env=env,
        start_new_session=True,  # its own group, like the engine supervisor starts vllm serve
    )


def test_orphaned_workers_keep_memory_until_their_group_is_killed(smi: ModuleType, host: GpuHost) -> None:
    server = start_server_standin(host.state_dir)
    try:
        wait_for(lambda: used(0) == 3 * GIB and used(1) == 5 * GIB, timeout=20.0)
        workers = [p.pid for i in (0, 1) for p in smi.nvmlDeviceGetComputeRunningProcesses(
            smi.nvmlDeviceGetHandleByIndex(i))]  # fmt: skip
        assert sorted(workers) == sorted(c.pid for c in psutil.Process(server.pid).children())

        server.send_signal(signal.SIGKILL)
        server.wait(5)
        time.sleep(1.5)  # three release delays: only live processes can still hold memory

        assert (used(0), used(1)) == (3 * GIB, 5 * GIB)
        assert all(psutil.Process(w).ppid() != server.pid for w in workers)  # orphaned, still running

        os.killpg(server.pid, signal.SIGKILL)
        wait_for(lambda: used(0) == 0 and used(1) == 0, timeout=2.0)
    finally:
        killpg_quietly(server.pid)
        server.wait(5)


def test_orphaned_workers_give_up_after_the_orphan_timeout(
    smi: ModuleType, host: GpuHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, "1.0")
    server = start_server_standin(host.state_dir)
    try:
        wait_for(lambda: used(0) == 3 * GIB and used(1) == 5 * GIB, timeout=20.0)
        server.send_signal(signal.SIGKILL)
        server.wait(5)
        time.sleep(0.6)
        assert used(1) == 5 * GIB  # still an orphan holding memory

        released_after = seconds_until(lambda: used(0) == 0 and used(1) == 0, timeout=5.0)
        assert released_after > 0.2  # 1 s timeout + 0.5 s delay, counted from about 0.6 s after the kill
    finally:
        killpg_quietly(server.pid)
        server.wait(5)


# ---- nvml errors and binding


def test_nvml_calls_before_init_raise_uninitialized() -> None:
    with pytest.raises(nvml.NVMLError_Uninitialized) as info:
        nvml.nvmlDeviceGetCount()
    assert info.value.value == nvml.NVML_ERROR_UNINITIALIZED == 1
    assert str(info.value) == "Uninitialized"
    assert isinstance(info.value, nvml.NVMLError)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_nvml_bad_index_and_unknown_uuid(smi: ModuleType) -> None:
    with pytest.raises(smi.NVMLError) as info:
        smi.nvmlDeviceGetHandleByIndex(2)
    assert type(info.value) is smi.NVMLError_InvalidArgument
    assert (info.value.value, str(info.value)) == (smi.NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument")
    with pytest.raises(smi.NVMLError_NotFound) as nf:
        smi.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    assert (nf.value.value, str(nf.value)) == (smi.NVML_ERROR_NOT_FOUND, "Not Found")
    # pynvml's constructor maps a code to its subclass
    assert type(smi.NVMLError(smi.NVML_ERROR_INVALID_ARGUMENT)) is smi.NVMLError_InvalidArgument


def test_nvml_after_shutdown_is_uninitialized_again(host: GpuHost) -> None:
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetMemoryInfo(handle)


def test_nvml_without_inventory_has_no_devices(state_dir: Path) -> None:
    nvml.nvmlInit()
    try:
        assert nvml.nvmlDeviceGetCount() == 0
    finally:
        nvml.nvmlShutdown()


def test_nvml_binds_to_the_state_dir_at_init(
    smi: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    GpuHost(other).ensure_inventory(make_gpus(other, "NVIDIA A10", 24 * GIB, 4))
    monkeypatch.setenv(STATE_DIR_ENV, str(other))
    assert smi.nvmlDeviceGetCount() == 2  # still bound to the first host
    smi.nvmlShutdown()
    smi.nvmlInit()  # the fixture's shutdown pairs with this one
    assert smi.nvmlDeviceGetCount() == 4
