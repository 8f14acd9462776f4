"""Host memory as two devices: the engine's process tree (RSS) and the host's used RAM.

For engines whose memory wall is host RAM: vLLM on CPU keeps its KV cache there, and
``--cpu-offload-gb`` pins weights there. Position 0 is the RSS of the root process and all its
descendants; position 1 is total − available of the whole host. Both are measured against the
host's total RAM.

Cost: listing the descendants means scanning every process on the host, so the tree is re-walked
every ``tree_refresh_s`` only; between walks a sample reads the RSS of the known processes (one small
procfs read each, through cached ``psutil.Process`` objects) and ``/proc/meminfo``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from autotuner.monitor.base import DeviceInfo, MemoryMonitor

TREE_INDEX = 0
HOST_INDEX = 1
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


class HostMonitor(MemoryMonitor):
    """``root_pid``: the engine's PID, or a callable giving it (None while no engine runs)."""

    def __init__(
        self, root_pid: Callable[[], int | None] | int | None = None, *, tree_refresh_s: float = 0.2
    ) -> None:
        if callable(root_pid):
            self._root_pid = root_pid
        else:
            fixed = root_pid
            self._root_pid = lambda: fixed
        self._refresh_s = tree_refresh_s
        total = int(psutil.virtual_memory().total)
        self._devices = [
            DeviceInfo(TREE_INDEX, "engine process tree RSS", "host-process-tree", total),
            DeviceInfo(HOST_INDEX, "host RAM used", "host-ram", total, shared=True),
        ]
        self._root: psutil.Process | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._walked_at = float("-inf")

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def sample(self) -> list[int]:
        mem = psutil.virtual_memory()
        return [self._tree_rss(), int(mem.total - mem.available)]

    def processes(self, position: int) -> list[tuple[int, int]]:
        # Host RAM is shared by everything on the box; the engine's tree is the part we can name.
        if position not in (TREE_INDEX, HOST_INDEX):
            raise IndexError(f"HostMonitor has 2 devices, not position {position}")
        self._walk()
        # An exited child not yet reaped (a zombie) shows RSS 0: it holds nothing.
        return sorted((pid, rss) for pid, rss in self._rss_by_pid() if rss > 0)

    def close(self) -> None:
        self._procs.clear()
        self._root = None

    # ---- the process tree

    def _tree_rss(self) -> int:
        if time.perf_counter() - self._walked_at >= self._refresh_s:
            self._walk()
        return sum(rss for _, rss in self._rss_by_pid())

    def _rss_by_pid(self) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        for pid, proc in list(self._procs.items()):
            try:
                found.append((pid, int(proc.memory_info().rss)))
            except _GONE:
                # Exited since the last walk. pop, not del: processes() may re-walk from another thread.
                self._procs.pop(pid, None)
        return found

    def _walk(self) -> None:
        self._walked_at = time.perf_counter()
        root = self._current_root()
        if root is None:
            self._procs.clear()
            return
        try:
            children = root.children(recursive=True)
        except _GONE:
            self._root = None
            self._procs.clear()
            return
        procs = {root.pid: root}
        for child in children:
            cached = self._procs.get(child.pid)
            # psutil compares (pid, create time): a reused PID gets a fresh object.
            procs[child.pid] = cached if cached is not None and cached == child else child
        self._procs = procs

    def _current_root(self) -> psutil.Process | None:
        pid = self._root_pid()
        if pid is None:
            self._root = None
            return None
        if self._root is not None and self._root.pid == pid and self._root.is_running():
            return self._root
        try:
            self._root = psutil.Process(pid)
        except _GONE:
            self._root = None
        return self._root
