"""Engines we started, on disk, so that a later run can stop the orphans of a crashed tuner — and
only those. An entry names a process group, the tuner that owned it and the engine's processes as
(pid, create time) pairs, refreshed while the engine runs. A process is ours to kill only while its
owner is dead and it is the very process we recorded (same PID *and* start time), or a member of the
engine's own session whose leader is still ours (workers forked after the last refresh).

An entry is trusted only when this user wrote it: a file of ours (not a link) in a directory of ours
that no one else can write. Anyone who could plant an entry could otherwise have our `measure` or daemon
kill a process of their choosing; an untrusted entry or directory is skipped with a warning.

Between spawning an engine and writing its entry the tuner may die too: a launch is announced first
(`launching`), the engine's environment carries the announcement's random token, and a later run stops
the processes that carry the token of a dead owner's announcement."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import structlog

from autotuner.proc_identity import CREATE_TIME_TOLERANCE_S, clock, create_time, live_process, same_start

log = structlog.get_logger("autotuner.engine")

HOME_ENV = "AUTOTUNER_HOME"
# After SIGKILL, how long a process may take to go (a CUDA process frees its memory while exiting).
KILL_WAIT_S = 10.0
# Our own engines' processes stay known this long after they stopped: memory they hold then is
# being released, not a stranger's.
RECENT_S = 120.0
# In an engine's environment: the token of the launch announced before it was spawned.
LAUNCH_ENV = "AUTOTUNER_ENGINE_LAUNCH"


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


@dataclass(frozen=True)
class LaunchIntent:
    """A spawn about to happen, on disk until the engine's own entry is."""

    token: str
    owner_pid: int
    owner_create_time: float
    started_at: float  # on the create-time clock (`proc_identity.clock`): the engine started after it


def group_members(pgid: int, not_before: float | None = None) -> list[int]:
    """Live (non-zombie) processes of a process group, optionally only those started since a time on
    the create-time clock, `proc_identity.clock` (an inspection helper; killing goes through
    `engine_processes`)."""
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
        leader = leader_create_time if leader_create_time is not None else create_time(pgid) or clock()
        entry = EngineEntry(pgid, leader, me, create_time(me) or 0.0, time.time(), argv0, [[pgid, leader]])
        self._write(entry)
        return entry

    @contextlib.contextmanager
    def launching(self, env: Mapping[str, str]) -> Iterator[dict[str, str]]:
        """Announce a spawn: yields `env` with the launch token. Spawn and `add` inside the block; the
        announcement goes when the block ends, so a tuner killed in between leaves it for `reap_orphans`."""
        me = os.getpid()
        intent = LaunchIntent(secrets.token_hex(16), me, create_time(me) or 0.0, clock())
        path = self.root / f"{intent.token}.launch"
        self._write_json(path, asdict(intent))
        try:
            yield {**env, LAUNCH_ENV: intent.token}
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

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
        self._write_json(self._path(entry.pgid), asdict(entry))

    def _write_json(self, path: Path, data: dict[str, object]) -> None:
        self._ensure_root()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data))
        os.replace(tmp, path)

    def _ensure_root(self) -> None:
        """The directory, created 0700 (its parents as the umask gives)."""
        try:
            self.root.mkdir(mode=0o700)
            os.chmod(self.root, 0o700)  # mkdir's mode passes through the umask
        except FileNotFoundError:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self._ensure_root()
        except FileExistsError:
            pass

    def _trusted_root(self) -> bool:
        """Ours, a real directory, and writable by no one else."""
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            return False
        problem = None
        if not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory (a symlink or file)"
        elif st.st_uid != os.geteuid():
            problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})"
        if problem is None:
            return True
        log.warning("engine registry ignored", directory=str(self.root),
                    reason=f"{problem}: anyone who can write there could have us kill their choice of "
                           f"process; fix with chmod 700 / chown, or remove it")
        return False

    def _trusted_entry(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            return True
        log.warning("engine registry entry ignored", entry=str(path),
                    reason=f"not a file of this user (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
                           "its processes are left alone")
        return False

    def remove(self, pgid: int, pids: Iterable[int] = ()) -> None:
        """Forget a stopped engine; its `pids` stay known as ours for `RECENT_S` (memory being freed)."""
        self._remember(pids)
        with contextlib.suppress(FileNotFoundError):
            self._path(pgid).unlink()

    def _remember(self, pids: Iterable[int]) -> None:
        now = time.monotonic()
        with self._lock:
            for pid in pids:
                self._recent[pid] = now
            for pid, at in list(self._recent.items()):
                if now - at > RECENT_S:
                    del self._recent[pid]

    def recently_stopped(self) -> set[int]:
        now = time.monotonic()
        with self._lock:
            return {pid for pid, at in self._recent.items() if now - at <= RECENT_S}

    def _read(self, path: Path) -> EngineEntry | None:
        """The entry at `path` when it is one we trust (see the module's docstring), else None."""
        data = self._read_json(path)
        try:
            return None if data is None else EngineEntry(**data)
        except TypeError:
            return None

    def _read_json(self, path: Path) -> dict[str, object] | None:
        if not self._trusted_root() or not self._trusted_entry(path):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _intents(self) -> list[tuple[Path, LaunchIntent]]:
        if not self.root.is_dir() or not self._trusted_root():
            return []
        found = []
        for path in sorted(self.root.glob("*.launch")):
            data = self._read_json(path)
            with contextlib.suppress(TypeError):
                if data is not None:
                    found.append((path, LaunchIntent(**data)))  # type: ignore[arg-type]
        return found

    def entries(self) -> list[EngineEntry]:
        if not self.root.is_dir() or not self._trusted_root():
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
        for path, intent in self._intents():
            if live_process(intent.owner_pid, intent.owner_create_time) is not None:
                continue
            # Its owner died between spawning and recording the engine: the token is all that names it.
            procs = _carrying(intent.token, not_before=intent.started_at)
            groups = {_pgid(p) for p in procs}
            if procs:
                stop_processes(procs, grace_s)
                stopped.extend(sorted(g for g in groups if g is not None))
            self._remember(p.pid for p in procs)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return stopped


def _carrying(token: str, not_before: float) -> list[psutil.Process]:
    """Live processes started since the launch whose environment holds its token."""
    found = []
    for proc in psutil.process_iter(["create_time", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or \
                proc.info["create_time"] < not_before - CREATE_TIME_TOLERANCE_S:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(LAUNCH_ENV) == token:
                found.append(proc)
    return found


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None
