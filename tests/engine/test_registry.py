"""The registry stops our orphans and nobody else: processes are matched by (pid, create time), with
one tolerance, and a process group whose leader is now someone else's is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotuner.engine.registry import EngineEntry, EngineRegistry
from autotuner.proc_identity import CREATE_TIME_TOLERANCE_S


@pytest.fixture
def registry(tmp_path: Path) -> EngineRegistry:
    return EngineRegistry(tmp_path / "home")


def dead_pid() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ctime = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, ctime


def sleeper() -> subprocess.Popen[bytes]:
    # Its own session and group, like an engine: pid == pgid == sid.
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def write(registry: EngineRegistry, entry: EngineEntry) -> None:
    registry._write(entry)


def test_a_stranger_that_reused_the_engines_pgid_is_not_killed(registry: EngineRegistry) -> None:
    stranger = sleeper()
    try:
        owner, owner_ctime = dead_pid()
        ctime = psutil.Process(stranger.pid).create_time()
        # We recorded an engine whose leader had this PID, started long before this process: the PID was
        # reused. Its owner tuner is dead, so the entry is an orphan's.
        write(registry, EngineEntry(stranger.pid, ctime - 3600, owner, owner_ctime, time.time() - 3600, "vllm",
                                    [[stranger.pid, ctime - 3600]]))
        assert registry.reap_orphans(grace_s=1) == []
        time.sleep(0.2)
        assert stranger.poll() is None, "a stranger's process was killed"
        assert registry.entries() == []  # the stale entry is gone
    finally:
        stranger.kill()
        stranger.wait()


def test_recorded_processes_of_a_dead_tuner_are_stopped(registry: EngineRegistry) -> None:
    engine = sleeper()
    try:
        owner, owner_ctime = dead_pid()
        ctime = psutil.Process(engine.pid).create_time()
        write(registry, EngineEntry(engine.pid, ctime, owner, owner_ctime, time.time(), "vllm",
                                    [[engine.pid, ctime]]))
        assert registry.reap_orphans(grace_s=1) == [engine.pid]
        assert engine.wait(timeout=5) is not None
    finally:
        if engine.poll() is None:
            engine.kill()


def test_a_live_owner_is_recognised_within_the_tolerance(registry: EngineRegistry) -> None:
    """Start times read back from JSON, or by another process, may differ by a little: a live tuner
    must not be taken for dead (and its running engine killed) for that."""
    engine = sleeper()
    try:
        me = psutil.Process(os.getpid())
        ctime = psutil.Process(engine.pid).create_time()
        write(registry, EngineEntry(engine.pid, ctime, me.pid, me.create_time() + CREATE_TIME_TOLERANCE_S / 2,
                                    time.time(), "vllm", [[engine.pid, ctime]]))
        assert registry.reap_orphans(grace_s=1) == []
        assert engine.poll() is None
    finally:
        engine.kill()
        engine.wait()


def test_the_simulator_uses_the_same_tolerance() -> None:
    from autotuner.sim import gpu_state

    assert gpu_state.same_start is __import__("autotuner.proc_identity", fromlist=["same_start"]).same_start
    assert not hasattr(gpu_state, "_CREATE_TIME_TOLERANCE_S")
