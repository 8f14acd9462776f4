"""GPU locks are machine-wide: two tuners with different `$AUTOTUNER_HOME`s (or users) contend for the
same GPU's lock, keyed by its UUID; a lock file planted as a symlink is never followed, and another
user's lock file still excludes us."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.engine import gpu_locks
from autotuner.engine.gpu_locks import LOCK_DIR_ENV, GpuLockedError, GpuLocks, lock_dir, lock_path
from autotuner.errors import InfrastructureError

HOLDER = textwrap.dedent("""
    import sys, time
    from autotuner.engine.gpu_locks import GpuLocks
    GpuLocks([(0, "GPU-shared")]).acquire()
    print("held", flush=True)
    time.sleep(60)
""")
TAKER = ("from autotuner.engine.gpu_locks import GpuLocks\n"
         "GpuLocks([(0, 'GPU-shared')]).acquire(wait_s=0.3); print('got it')")


def env_for(home: Path, locks: Path) -> dict[str, str]:
    return {**os.environ, "AUTOTUNER_HOME": str(home), LOCK_DIR_ENV: str(locks)}


def test_two_homes_contend_for_one_gpu(tmp_path: Path) -> None:
    locks = tmp_path / "machine-locks"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                              env=env_for(tmp_path / "home-a", locks))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = subprocess.run([sys.executable, "-c", TAKER], capture_output=True, text=True, timeout=60,
                               env=env_for(tmp_path / "home-b", locks))
        assert other.returncode == 1 and f"in use by another autotuner (pid {holder.pid}" in other.stderr, other.stderr
    finally:
        holder.kill()
        holder.wait()
    again = subprocess.run([sys.executable, "-c", TAKER], capture_output=True, text=True, timeout=60,
                           env=env_for(tmp_path / "home-b", locks))
    assert again.returncode == 0 and again.stdout.strip() == "got it", again.stderr
    # The shared directory is sticky and world-writable, like /tmp; lock files are readable by all.
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    assert stat.S_IMODE(lock_path("GPU-shared", locks).stat().st_mode) == 0o644


def test_the_default_directory_is_machine_wide_not_per_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    assert lock_dir() in (Path("/run/lock/autotuner"), Path("/tmp/autotuner-gpu-locks"))


def test_a_symlink_planted_as_a_lock_file_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    locks = tmp_path / "locks"
    locks.mkdir()
    lock_path("GPU-x", locks).symlink_to(victim)
    with pytest.raises(InfrastructureError, match="cannot open its lock"):
        GpuLocks([(0, "GPU-x")], locks).acquire()
    assert victim.read_text() == "keep me\n"


def test_a_hard_link_planted_as_a_lock_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    locks = tmp_path / "locks"
    locks.mkdir()
    os.link(victim, lock_path("GPU-x", locks))
    with pytest.raises(InfrastructureError, match="not a plain lock file"):
        GpuLocks([(0, "GPU-x")], locks).acquire()
    assert victim.read_text() == "keep me\n"


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A lock directory another user can reach (pytest's own tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="autotuner-test-locks-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hold_as(uid: int, gid: int, locks: Path) -> tuple[int, int]:
    """A forked process of another user that holds GPU-shared until killed: (pid, read end of its pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            gpu_locks._held.clear()  # a fork inherits this process's holds; the child is another tuner
            gpu_locks._engines.clear()
            os.setgid(gid)
            os.setuid(uid)
            GpuLocks([(0, "GPU-shared")], locks).acquire()
            os.write(write, b"held")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_another_users_lock_file_excludes_both_ways(world_dir: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    path = lock_path("GPU-shared", world_dir)
    # nobody's tuner creates and holds the lock file: we are refused, and we do not write into it.
    pid, pipe = hold_as(nobody.pw_uid, nobody.pw_gid, world_dir)
    try:
        assert os.read(pipe, 4) == b"held"
        assert path.stat().st_uid == nobody.pw_uid
        with pytest.raises(GpuLockedError, match=f"pid {pid}"):
            GpuLocks([(0, "GPU-shared")], world_dir).acquire(wait_s=0.3)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(pipe)
    with GpuLocks([(0, "GPU-shared")], world_dir):
        assert path.stat().st_uid == nobody.pw_uid and path.read_text() == str(pid)  # theirs, left as it was
        # While we hold it, nobody's tuner is refused.
        pid, pipe = hold_as(nobody.pw_uid, nobody.pw_gid, world_dir)
        try:
            assert os.read(pipe, 4) == b""  # refused (GpuLockedError): it exited without holding
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pipe)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_lock_file_of_ours_is_usable_by_another_user(world_dir: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    with GpuLocks([(0, "GPU-shared")], world_dir):
        pass  # root's lock file now exists, 0644: nobody can open it read-only and lock it
    pid, pipe = hold_as(nobody.pw_uid, nobody.pw_gid, world_dir)
    try:
        assert os.read(pipe, 4) == b"held"
        with pytest.raises(GpuLockedError):
            GpuLocks([(0, "GPU-shared")], world_dir).acquire(wait_s=0.3)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(pipe)
