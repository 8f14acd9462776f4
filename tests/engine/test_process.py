"""Engine supervision with the simulator as the engine: readiness, fail-fast, escalating stop,
orphans of a crashed tuner found through the registry."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotuner.engine.ports import free_port
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry, group_members

SIM = [sys.executable, "-m", "autotuner.sim", "serve", "llama-2-7b", "--sim-speedup", "200",
       "--host", "127.0.0.1"]


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EngineRegistry:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return EngineRegistry()


def engine(tmp_path: Path, registry: EngineRegistry, *extra: str,
           env: dict[str, str] | None = None) -> tuple[EngineProcess, str]:
    port = free_port()
    proc = EngineProcess([*SIM, "--port", str(port), *extra], env or dict(os.environ), tmp_path / "engine.log",
                         registry)
    return proc, f"http://127.0.0.1:{port}"


def test_ready_then_stop_leaves_nothing(sim_state: Path, tmp_path: Path, registry: EngineRegistry) -> None:
    proc, url = engine(tmp_path, registry)
    proc.start()
    try:
        assert asyncio.run(proc.wait_ready(url, "llama-2-7b", 30)) is None
        assert proc.facts.kv_cache_tokens and proc.facts.kv_cache_tokens > 0
        assert [e.pgid for e in registry.entries()] == [proc.pid]
        members = group_members(proc.pid)
        assert len(members) == 2  # server + one TP worker
    finally:
        assert proc.stop(grace_s=5)
    assert proc.returncode == 0
    assert not group_members(proc.pid)
    assert registry.entries() == []
    assert "GPU KV cache size" in (tmp_path / "engine.log").read_text()


def test_fail_fast_when_the_engine_exits_during_startup(sim_state: Path, tmp_path: Path,
                                                        registry: EngineRegistry) -> None:
    proc, url = engine(tmp_path, registry, "--gpu-memory-utilization", "0.99")
    proc.start()
    t0 = time.monotonic()
    assert asyncio.run(proc.wait_ready(url, "llama-2-7b", 60)) == "exited"
    assert time.monotonic() - t0 < 20
    proc.stop(grace_s=2)
    assert proc.facts.failure == "startup-failed"
    assert "less than desired GPU memory utilization" in (proc.facts.reason or "")


def test_wrong_served_name_times_out(sim_state: Path, tmp_path: Path, registry: EngineRegistry) -> None:
    proc, url = engine(tmp_path, registry)
    proc.start()
    try:
        assert asyncio.run(proc.wait_ready(url, "other-name", 3)) == "timeout"
    finally:
        proc.stop(grace_s=5)


def test_kill_now_kills_the_whole_group(sim_state: Path, tmp_path: Path, registry: EngineRegistry) -> None:
    proc, url = engine(tmp_path, registry, "-tp", "2")
    proc.start()
    assert asyncio.run(proc.wait_ready(url, "llama-2-7b", 30)) is None
    proc.kill_now()
    deadline = time.monotonic() + 5
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_members(proc.pid)
    assert proc.stop(grace_s=1)


CRASHING_TUNER = textwrap.dedent("""
    import asyncio, os, sys, time
    from pathlib import Path
    from autotuner.engine.process import EngineProcess
    from autotuner.engine.registry import EngineRegistry
    argv = sys.argv[1:]
    proc = EngineProcess(argv, dict(os.environ), Path(os.environ["LOG"]), EngineRegistry())
    proc.start()
    print(proc.pid, flush=True)
    time.sleep(600)
""")


def test_orphans_of_a_killed_tuner_are_reaped_and_only_those(sim_state: Path, tmp_path: Path,
                                                            registry: EngineRegistry) -> None:
    port = free_port()
    env = {**os.environ, "LOG": str(tmp_path / "orphan.log")}
    tuner = subprocess.Popen([sys.executable, "-c", CRASHING_TUNER, *SIM, "--port", str(port)],
                             stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    # A live engine of THIS process (on other simulated GPUs) must survive the reaping.
    mine, _ = engine(tmp_path, registry, env={**os.environ, "AUTOTUNER_SIM_STATE_DIR": str(tmp_path / "other")})
    try:
        assert tuner.stdout is not None
        orphan_pgid = int(tuner.stdout.readline())
        deadline = time.monotonic() + 20
        while len(group_members(orphan_pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        mine.start()
        os.kill(tuner.pid, signal.SIGKILL)  # the tuner dies; its engine lives on
        tuner.wait()
        time.sleep(0.5)
        assert group_members(orphan_pgid), "the engine should outlive its tuner"
        other = EngineRegistry()  # what the next run sees
        assert sorted(e.pgid for e in other.entries()) == sorted([orphan_pgid, mine.pid])
        assert other.reap_orphans(grace_s=3) == [orphan_pgid]
        assert not group_members(orphan_pgid)
        assert group_members(mine.pid)
        assert [e.pgid for e in other.entries()] == [mine.pid]
    finally:
        mine.stop(grace_s=3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tuner.pid, signal.SIGKILL)
