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

from autotuner.engine.registry import LAUNCH_ENV, EngineEntry, EngineRegistry
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


def carrier(token: str) -> subprocess.Popen[bytes]:
    """An engine spawned with a launch's token, and a worker it forked (same environment)."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            env={**os.environ, LAUNCH_ENV: token})


DYING_TUNER = """
import os, subprocess, sys
from pathlib import Path
from autotuner.engine.registry import EngineRegistry
code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \\
       "time.sleep(60)"
with EngineRegistry(Path(sys.argv[1])).launching(dict(os.environ)) as env:
    engine = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(engine.pid, flush=True)
    os._exit(0)  # as SIGKILL would: the announcement stays, the engine is on no record
"""


def test_an_engine_spawned_but_not_yet_recorded_when_its_tuner_died_is_stopped(registry: EngineRegistry) -> None:
    """SIGKILL between spawn and entry: only the launch's announcement names the engine. The tuner
    announces through `launching` itself, so the announcement's time is the one the reaper compares
    with the engine's create time (psutil's clock lags the wall clock by up to a second: an engine
    once outlived its reaper because its leader seemed to predate its own launch)."""
    tuner = subprocess.run([sys.executable, "-c", DYING_TUNER, str(registry.root.parent)], capture_output=True,
                           text=True, timeout=60)
    engine = psutil.Process(int(tuner.stdout))
    try:
        deadline = time.monotonic() + 10
        while len(engine.children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [engine.pid] + [c.pid for c in engine.children()]
        assert len(tree) == 2, "the engine never forked its worker"
        assert len(list(registry.root.glob("*.launch"))) == 1, "the dead tuner's announcement is on disk"
        assert registry.reap_orphans(grace_s=1) == [engine.pid]
        engine.wait(timeout=5)
        assert not [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not list(registry.root.glob("*.launch")), "the announcement outlived the reaping"
        assert set(tree) <= registry.recently_stopped(), "their memory is ours while it is freed"
    finally:
        if engine.is_running():
            os.killpg(engine.pid, 9)


def test_a_live_tuners_launch_in_progress_is_left_alone(registry: EngineRegistry) -> None:
    engine = None
    try:
        with registry.launching({**os.environ}) as env:
            assert list(registry.root.glob("*.launch")), "announced before the spawn"
            engine = carrier(env[LAUNCH_ENV])
            time.sleep(0.2)
            assert registry.reap_orphans(grace_s=1) == []
            assert engine.poll() is None
        assert not list(registry.root.glob("*.launch")), "the announcement goes once the block ends"
    finally:
        if engine is not None:
            os.killpg(engine.pid, 9)
            engine.wait()
