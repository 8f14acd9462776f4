"""One lock per GPU across every autotuner process on the box, whatever database each one uses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotuner.engine.gpu_locks import GpuLockedError, GpuLocks, GpusBusyError, lock_path

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from autotuner.engine.gpu_locks import GpuLocks
    locks = GpuLocks([(0, "GPU-aaaa"), (1, "GPU-bbbb")], Path(sys.argv[1]))
    locks.acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = GpuLocks([(1, "GPU-bbbb"), (2, "GPU-cccc")], tmp_path)
        with pytest.raises(GpuLockedError, match=rf"GPU 1 \(GPU-bbbb\) is in use by another autotuner "
                                                 rf"\(pid {holder.pid}"):
            mine.acquire(wait_s=0.3)
        assert issubclass(GpuLockedError, GpusBusyError)
        # All or none: GPU 2, free, was not kept locked by the failed attempt.
        with GpuLocks([(2, "GPU-cccc")], tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's lock: no stale lock file blocks us.
    with GpuLocks([(0, "GPU-aaaa"), (1, "GPU-bbbb")], tmp_path):
        assert lock_path("GPU-aaaa", tmp_path).read_text() == str(os.getpid())


def test_waiting_gets_the_lock_once_released(tmp_path: Path) -> None:
    first = GpuLocks([(0, "GPU-aaaa")], tmp_path)
    first.acquire()
    code = ("import sys; from pathlib import Path; from autotuner.engine.gpu_locks import GpuLocks\n"
            "GpuLocks([(0, 'GPU-aaaa')], Path(sys.argv[1])).acquire(wait_s=30); print('got it')")
    waiter = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=1.0)
        first.release()
        out, _ = waiter.communicate(timeout=30)
        assert out.strip() == "got it"
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_locks_are_reentrant_within_a_process_and_exclusive_across(tmp_path: Path) -> None:
    study = GpuLocks([(0, "GPU-aaaa")], tmp_path)
    study.acquire()
    trial = GpuLocks([(0, "GPU-aaaa")], tmp_path)
    trial.acquire()  # the study holds it; its own trial takes it again without blocking
    trial.release()
    code = ("import sys; from pathlib import Path; from autotuner.engine.gpu_locks import GpuLocks\n"
            "GpuLocks([(0, 'GPU-aaaa')], Path(sys.argv[1])).acquire()")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and f"another autotuner (pid {os.getpid()}" in other.stderr
    study.release()
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
