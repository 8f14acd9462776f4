"""HostMonitor over real processes: a tree whose grandchild allocates 200 MB, then dies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from autotuner.monitor import HostMonitor
from tests.support.waiting import wait_for

MB = 1 << 20
ALLOC_MB = 200

# The grandchild touches every page (bytes * n is filled, unlike a calloc'd bytearray) when asked.
GRANDCHILD = f"""
import os, sys, time
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
block = b"\\x01" * ({ALLOC_MB} << 20)
print("allocated", flush=True)
time.sleep(60)
"""
ROOT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1]]).wait()
time.sleep(60)
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT, GRANDCHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the cleanup kills exactly this tree
    )
    try:
        yield root
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(root.pid, signal.SIGKILL)
        root.wait(10)




def test_tree_rss_follows_a_grandchild_that_allocates_then_dies(tree: subprocess.Popen[str]) -> None:
    assert tree.stdout is not None and tree.stdin is not None
    word, pid = tree.stdout.readline().split()
    grandchild = int(pid)
    assert word == "ready"
    monitor = HostMonitor(tree.pid)
    assert [d.name for d in monitor.devices()] == ["engine process tree RSS", "host RAM used"]
    assert all(d.total_bytes == psutil.virtual_memory().total for d in monitor.devices())

    # The walk is periodic: the grandchild shows up within one refresh interval.
    wait_for(lambda: {p for p, _ in monitor.processes(0)} == {tree.pid, grandchild}, timeout=2.0)
    before, host_used = monitor.sample()
    assert 0 < before < 200 * MB  # two idle interpreters
    assert 0 < host_used <= monitor.devices()[1].total_bytes

    tree.stdin.write("go\n")
    tree.stdin.flush()
    assert tree.stdout.readline().strip() == "allocated"
    grown = monitor.sample()[0]
    assert grown - before >= (ALLOC_MB - 10) * MB
    assert dict(monitor.processes(0))[grandchild] >= ALLOC_MB * MB

    os.kill(grandchild, signal.SIGKILL)
    # Vanishing mid-walk is not an error; the memory leaves the sum.
    wait_for(lambda: monitor.sample()[0] < before + 20 * MB, timeout=2.0)
    assert [p for p, _ in monitor.processes(0)] == [tree.pid]


def test_the_root_may_come_and_go(tree: subprocess.Popen[str]) -> None:
    assert tree.stdout is not None
    tree.stdout.readline()
    root: list[int | None] = [None]
    monitor = HostMonitor(lambda: root[0], tree_refresh_s=0.0)
    assert monitor.sample()[0] == 0
    assert monitor.processes(0) == []

    root[0] = tree.pid
    assert monitor.sample()[0] > 0
    assert len(monitor.processes(0)) == 2

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root[0] = dead.pid  # reaped: no such process
    assert monitor.sample()[0] == 0
    assert monitor.sample()[1] > 0  # host RAM is there regardless
