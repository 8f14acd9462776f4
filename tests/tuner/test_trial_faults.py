"""Faults between the engine's start and the end of a trial, injected for real: a monitor that stops
reading, a registry that cannot be written, a cancelled trial, an engine SIGKILLed just before the
next trial. Each time the engine is stopped and the GPUs are released."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from autotuner.backends import backend_for
from autotuner.engine.gpu_locks import GpuLocks
from autotuner.engine.ports import free_port
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.monitor import DeviceInfo, MemoryMonitor, MonitorError
from autotuner.scenario import load_scenario
from autotuner.sim.gpu_state import GpuHost
from autotuner.tuner.lifecycle import measure
from tests.support.quickstart import scenario

GOOD = {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_state: Path) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class FailingMonitor(MemoryMonitor):
    """The simulator's NVML monitor, except that every sample from the `fail_from`-th on raises, as
    NVML does when a GPU falls off the bus."""

    def __init__(self, inner: MemoryMonitor, fail_from: int) -> None:
        self.inner = inner
        self.fail_from = fail_from
        self.calls = 0

    def devices(self) -> list[DeviceInfo]:
        return self.inner.devices()

    def sample(self) -> list[int]:
        self.calls += 1
        if self.calls >= self.fail_from:
            raise MonitorError("NVML memory query failed: GPU is lost")
        return self.inner.sample()

    def processes(self, position: int) -> list[tuple[int, int]]:
        return self.inner.processes(position)

    def close(self) -> None:
        self.inner.close()


def gpus_released(state: Path, timeout: float = 15.0) -> bool:
    host = GpuHost(state)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(host.used_bytes(i) == 0 for i in range(8)):
            return True
        time.sleep(0.1)
    return all(host.used_bytes(i) == 0 for i in range(8))



def sim_processes(state: Path) -> list[int]:
    """Simulated engines and workers of this test's box (they inherit its state directory)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get("AUTOTUNER_SIM_STATE_DIR") == str(state):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def lock_is_free(sc_path: Path) -> bool:
    sc = load_scenario(sc_path)
    with backend_for(sc).monitor(sc) as monitor:
        locks = GpuLocks([(d.index, d.uuid) for d in monitor.devices()])
        locks.acquire()
        locks.release()
    return True


def test_first_sample_failing_stops_the_engine_and_is_monitor_failed(home: Path, tmp_path: Path,
                                                                     sim_state: Path) -> None:
    path = scenario(tmp_path)
    sc = load_scenario(path)
    # Call 1: the pre-launch baseline; call 2: the sampler's first sample, after the engine started.
    monitor = FailingMonitor(backend_for(sc).monitor(sc), fail_from=2)
    result = asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs", monitor=monitor))
    assert result.outcome == "monitor-failed" and result.infrastructure
    assert not result.feasible and result.metrics == {}
    assert "GPU is lost" in (result.reason or "")
    assert sim_processes(sim_state) == [], "the engine outlived the failed sampler"
    assert gpus_released(sim_state)
    assert EngineRegistry().entries() == []
    assert lock_is_free(path)


def test_sampler_dying_mid_run_is_no_memory_evidence(home: Path, tmp_path: Path, sim_state: Path) -> None:
    sc = load_scenario(scenario(tmp_path, workload__requests__count=32, engine__sim__speedup=5))
    # Enough samples to get the engine serving, then the monitor is gone for good.
    monitor = FailingMonitor(backend_for(sc).monitor(sc), fail_from=300)
    t0 = time.monotonic()
    result = asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs", monitor=monitor))
    assert result.outcome == "monitor-failed" and result.infrastructure, result.outcome
    assert "memory sampling failed" in (result.reason or "")
    assert not result.feasible
    assert monitor.calls >= 300
    assert time.monotonic() - t0 < 60, "the trial went on with nobody watching the OOM wall"
    assert gpus_released(sim_state)


def test_registry_write_failing_after_popen_stops_the_engine(home: Path, tmp_path: Path,
                                                            sim_state: Path) -> None:
    path = scenario(tmp_path)
    sc = load_scenario(path)
    broken = tmp_path / "broken-home"
    broken.mkdir()
    (broken / "engines").write_text("a file where the registry's directory should be")
    with pytest.raises(OSError):
        asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs", registry=EngineRegistry(broken)))
    assert sim_processes(sim_state) == [], "the engine outlived the failed registry write"
    assert gpus_released(sim_state)
    assert lock_is_free(path)
    # The next trial is not refused because of our own leftover engine.
    assert asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs")).outcome == "ok"


def test_cancelled_trial_leaves_no_task_and_no_engine(home: Path, tmp_path: Path, sim_state: Path) -> None:
    sc = load_scenario(scenario(tmp_path, workload__requests__count=64, engine__sim__speedup=2))
    leftovers: list[str] = []

    async def main() -> None:
        replaying = asyncio.Event()
        task = asyncio.ensure_future(measure(sc, GOOD, log_dir=tmp_path / "logs",
                                             on_phase=lambda p: p == "replay" and replaying.set()))
        await asyncio.wait_for(replaying.wait(), 60)
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # a leaked task would still be pending now
        leftovers.extend(repr(t.get_coro()) for t in asyncio.all_tasks() if t is not asyncio.current_task())

    asyncio.run(main())
    assert leftovers == []
    assert gpus_released(sim_state)


def test_memory_of_our_sigkilled_engine_is_waited_for_not_refused(home: Path, tmp_path: Path, sim_state: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A killed CUDA process's memory lingers a moment: make that moment long enough to meet.
    monkeypatch.setenv("AUTOTUNER_SIM_RELEASE_DELAY_S", "3")
    sc = load_scenario(scenario(tmp_path))
    registry = EngineRegistry()
    port = free_port()
    from autotuner.engine.launch import plan_launch

    plan = plan_launch(sc, GOOD, port=port)
    engine = EngineProcess(plan.argv, plan.env, tmp_path / "first.log", registry)
    engine.start()
    try:
        assert asyncio.run(engine.wait_ready(plan.base_url, plan.served_name, 60)) is None
        engine.record_members()
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.stop(grace_s=1)
    assert GpuHost(sim_state).used_bytes(0) > 1 << 30, "the killed engine's memory should still show"
    result = asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs", registry=registry))
    assert result.outcome == "ok", result.reason


def test_two_tuners_with_different_databases_never_share_the_gpus(home: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    path = scenario(tmp_path, workload__requests__count=64, workload__requests__output_tokens=256,
                    engine__sim__speedup=2)
    first = subprocess.Popen([sys.executable, "-m", "autotuner", "measure", str(path), "--set",
                              "max-num-batched-tokens=1024", "--set", "gpu-memory-utilization=0.8"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not EngineRegistry().entries():
            time.sleep(0.2)
        assert EngineRegistry().entries(), "the first tuner never started its engine"
        second = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(path), "--storage",
                                 str(tmp_path / "other.db"), "--trials", "1"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"is in use by another autotuner (pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None, "the first tuner's trial was disturbed"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert gpus_released(Path(os.environ["AUTOTUNER_SIM_STATE_DIR"]))


def test_gpu_lost_mid_trial_in_the_simulated_driver_is_monitor_failed(home: Path, tmp_path: Path,
                                                                      sim_state: Path) -> None:
    from autotuner.sim.gpu_state import clear_nvml_fault, inject_nvml_fault

    sc = load_scenario(scenario(tmp_path, workload__requests__count=32, engine__sim__speedup=5))

    def on_phase(phase: str) -> None:
        if phase == "replay":
            inject_nvml_fault(sim_state, 15, gpu=5)  # NVML_ERROR_GPU_IS_LOST on one of the eight

    try:
        result = asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs", on_phase=on_phase))
    finally:
        clear_nvml_fault(sim_state)
    assert result.outcome == "monitor-failed" and result.infrastructure
    assert "GPU is lost" in (result.reason or "")
    assert gpus_released(sim_state)
    assert asyncio.run(measure(sc, GOOD, log_dir=tmp_path / "logs")).outcome == "ok"
