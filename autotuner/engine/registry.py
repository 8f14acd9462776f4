"""Engines we started, on disk, so that a later run can stop the orphans of a crashed tuner — and
only those. An entry names a process group, the tuner that owned it and the engine's processes as
(pid, create time) pairs, refreshed while the engine runs. A process is ours to kill only while its
owner is dead and it is the very process we recorded (same PID *and* start time), or a member of the
engine's own session whose leader is still ours (workers forked after the last refresh)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from autotuner.proc_identity import CREATE_TIME_TOLERANCE_S, create_time, live_process, same_start

HOME_ENV = "AUTOTUNER_HOME"
# After SIGKILL, how long a process may take to go (a CUDA process frees its memory while exiting).
KILL_WAIT_S = 10.0
# Our own engines' processes stay known this long after they stopped: memory they hold then is
# being released, not a stranger's.
RECENT_S = 120.0


def autotuner_home() -> Path:
    value = os.environ.get(HOME_ENV)
    if value:
        return Path(value)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "autotuner"


@dataclass(frozen=True)
class EngineEntry:
    pgid: int
    leader_create_time: float
    owner_pid: int
    owner_create_time: float
    started_at: float
    argv0: str
    members: list[list[float]] = field(default_factory=list)  # [pid, create_time] of each process seen


def group_members(pgid: int, not_before: float | None = None) -> list[int]:
    """Live (non-zombie) processes of a process group, optionally only those started since a time
    (an inspection helper; killing goes through `engine_processes`)."""
    members = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        if not_before is not None and proc.info["create_time"] < not_before - CREATE_TIME_TOLERANCE_S:
            continue
        members.append(proc.pid)
    return members


def engine_processes(pgid: int, leader_create_time: float, recorded: Iterable[tuple[int, float]] = ()) -> \
        list[psutil.Process]:
    """The live processes of one engine: the recorded (pid, create time) pairs that still match, and
    members of the engine's session (it is its own session and group) started since its leader — but
    only while that leader is gone or is still our leader, so a reused PGID never makes strangers ours."""
    found: dict[int, psutil.Process] = {}
    for pid, ctime in recorded:
        proc = live_process(int(pid), ctime)
        if proc is not None:
            found[proc.pid] = proc
    leader_ctime = create_time(pgid)
    if leader_ctime is not None and not same_start(leader_ctime, leader_create_time):
        return list(found.values())  # the PGID now belongs to someone else
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        if proc.pid in found or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.getpgid(proc.pid) != pgid or os.getsid(proc.pid) != pgid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        if proc.info["create_time"] >= leader_create_time - CREATE_TIME_TOLERANCE_S:
            found[proc.pid] = proc
    return list(found.values())


def stop_processes(procs: list[psutil.Process], grace_s: float) -> bool:
    """SIGTERM, wait `grace_s`, SIGKILL what is left, wait. True when none is left. psutil's Process
    objects check PID and start time before each signal, so a PID reused meanwhile is never hit."""
    for sig_name in ("terminate", "kill"):
        alive = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                getattr(proc, sig_name)()
                alive.append(proc)
        _, procs = psutil.wait_procs(alive, timeout=grace_s if sig_name == "terminate" else KILL_WAIT_S)
        procs = [p for p in procs if _running(p)]
        if not procs:
            return True
    return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class EngineRegistry:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or autotuner_home()) / "engines"
        self._lock = threading.Lock()
        self._recent: dict[int, float] = {}  # pid -> when its engine stopped (this process only)

    def _path(self, pgid: int) -> Path:
        return self.root / f"{pgid}.json"

    def add(self, pgid: int, argv0: str, leader_create_time: float | None = None) -> EngineEntry:
        me = os.getpid()
        leader = leader_create_time if leader_create_time is not None else create_time(pgid) or time.time()
        entry = EngineEntry(pgid, leader, me, create_time(me) or 0.0, time.time(), argv0, [[pgid, leader]])
        self._write(entry)
        return entry

    def record_members(self, pgid: int, processes: Iterable[psutil.Process]) -> None:
        """Add the engine's processes seen now to its entry (no-op when the entry is gone)."""
        with self._lock:
            entry = self._read(self._path(pgid))
            if entry is None:
                return
            known = {int(pid) for pid, _ in entry.members}
            new = []
            for proc in processes:
                with contextlib.suppress(psutil.Error):
                    if proc.pid not in known:
                        new.append([proc.pid, proc.create_time()])
            if new:
                self._write(EngineEntry(**{**asdict(entry), "members": entry.members + new}))

    def _write(self, entry: EngineEntry) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(entry.pgid)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(entry)))
        os.replace(tmp, path)

    def remove(self, pgid: int, pids: Iterable[int] = ()) -> None:
        """Forget a stopped engine; its `pids` stay known as ours for `RECENT_S` (memory being freed)."""
        now = time.monotonic()
        with self._lock:
            for pid in pids:
                self._recent[pid] = now
            for pid, at in list(self._recent.items()):
                if now - at > RECENT_S:
                    del self._recent[pid]
        with contextlib.suppress(FileNotFoundError):
            self._path(pgid).unlink()

    def recently_stopped(self) -> set[int]:
        now = time.monotonic()
        with self._lock:
            return {pid for pid, at in self._recent.items() if now - at <= RECENT_S}

    @staticmethod
    def _read(path: Path) -> EngineEntry | None:
        try:
            return EngineEntry(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def entries(self) -> list[EngineEntry]:
        if not self.root.is_dir():
            return []
        return [e for e in (self._read(p) for p in sorted(self.root.glob("*.json"))) if e is not None]

    def reap_orphans(self, grace_s: float = 5.0) -> list[int]:
        """Stop every registered engine whose owning tuner is gone. Returns the pgids stopped."""
        stopped = []
        for entry in self.entries():
            if live_process(entry.owner_pid, entry.owner_create_time) is not None:
                continue  # its tuner (maybe this one) is alive and owns it
            procs = engine_processes(entry.pgid, entry.leader_create_time,
                                     [(int(pid), ctime) for pid, ctime in entry.members])
            if procs:
                stop_processes(procs, grace_s)
                stopped.append(entry.pgid)
            self.remove(entry.pgid, [p.pid for p in procs])
        return stopped
