"""The engine registry trusts only what this user wrote: an entry owned by another user, a symlink, or
any entry in a directory others can write is ignored with a warning, so a planted entry can never make
our `measure` or daemon kill a process of someone's choosing."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from structlog.testing import capture_logs

from autotuner.engine.registry import EngineEntry, EngineRegistry


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process of its own session and group, like an engine; its tuner is dead, so an entry naming it
    is an orphan's the registry would stop."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def orphan_entry(proc: subprocess.Popen[bytes]) -> EngineEntry:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_ctime = psutil.Process(dead.pid).create_time()
    dead.wait()
    ctime = psutil.Process(proc.pid).create_time()
    return EngineEntry(proc.pid, ctime, dead.pid, dead_ctime, time.time(), "vllm", [[proc.pid, ctime]])


def reap(registry: EngineRegistry, victim: subprocess.Popen[bytes]) -> list[dict[str, object]]:
    with capture_logs() as logs:
        assert registry.reap_orphans(grace_s=1) == []
    time.sleep(0.2)
    assert victim.poll() is None, "the registry killed a process named by an entry it should not trust"
    return logs


def test_the_directory_is_created_0700_and_entries_0600(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    old = os.umask(0)
    try:
        registry = EngineRegistry(tmp_path / "home")
        registry._write(orphan_entry(victim))
    finally:
        os.umask(old)
    assert stat.S_IMODE(registry.root.stat().st_mode) == 0o700
    [entry] = registry.root.glob("*.json")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert registry.reap_orphans(grace_s=1) == [victim.pid]  # our own orphan: stopped


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_an_entry_owned_by_another_user_is_ignored(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    registry = EngineRegistry(tmp_path / "home")
    registry._write(orphan_entry(victim))
    [entry] = registry.root.glob("*.json")
    nobody = pwd.getpwnam("nobody")
    os.chown(entry, nobody.pw_uid, nobody.pw_gid)
    logs = reap(registry, victim)
    assert any(e["event"] == "engine registry entry ignored" for e in logs), logs
    assert registry.entries() == []
    assert entry.exists()  # not ours to remove either


@pytest.mark.parametrize("bits", [0o020, 0o002])
def test_a_directory_others_can_write_is_ignored(tmp_path: Path, victim: subprocess.Popen[bytes], bits: int) -> None:
    registry = EngineRegistry(tmp_path / "home")
    registry._write(orphan_entry(victim))
    registry.root.chmod(0o700 | bits)
    logs = reap(registry, victim)
    assert any(e["event"] == "engine registry ignored" for e in logs), logs


def test_a_symlinked_entry_is_ignored(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    registry = EngineRegistry(tmp_path / "home")
    registry._write(orphan_entry(victim))
    [entry] = registry.root.glob("*.json")
    planted = tmp_path / "planted.json"
    entry.rename(planted)
    entry.symlink_to(planted)
    reap(registry, victim)
