"""One lock per GPU, machine-wide: `<lock dir>/<GPU UUID>.lock`, held with `flock` from the check that
the GPU is free until our engine on it has stopped and its memory is back. Two tuners with different
databases or different `$AUTOTUNER_HOME`s, of one user or of two (or `measure` beside `tune`), never
share a GPU.

The lock directory is one per machine: `$AUTOTUNER_GPU_LOCK_DIR` when set (tests, or a site's own
choice), else /run/lock/autotuner (a tmpfs, emptied at boot), else /tmp/autotuner-gpu-locks. It is
created sticky and world-writable like /tmp (mode 1777): every user's tuner creates its lock files there
and nobody can remove another's. A lock file is opened without following symlinks and must be a plain
file; another user's lock file is locked through a read-only descriptor (an `flock` needs no write).

The kernel drops an `flock` when its holder dies, so a killed tuner never leaves a stale lock; the
file keeps the holder's PID, for the message the next one prints. Within one process the locks are
re-entrant (the study holds its GPUs for the whole run, each trial takes them again), since two
`flock`s of one file from one process would block each other. Trials side by side in one process
take theirs as `engine` locks: at most one engine holds a GPU, also among this process's trials.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from autotuner.errors import InfrastructureError
from autotuner.filelocks import HeldLock, holder_of, lock_now, open_shared_lock_file, release, write_holder

LOCK_DIR_ENV = "AUTOTUNER_GPU_LOCK_DIR"
DEFAULT_LOCK_DIRS = (Path("/run/lock/autotuner"), Path("/tmp/autotuner-gpu-locks"))
SHARED_MODE = 0o1777
POLL_S = 0.1

_held_lock = threading.Lock()
_held: dict[Path, list[int]] = {}  # lock file -> [fd, holds] in this process
_engines: set[Path] = set()  # lock files an engine of this process holds (trials side by side)


def lock_dir() -> Path:
    """Where this machine's GPU locks live (see the module's docstring)."""
    value = os.environ.get(LOCK_DIR_ENV)
    if value:
        return Path(value)
    system, fallback = DEFAULT_LOCK_DIRS
    return system if os.access(system.parent, os.W_OK | os.X_OK) else fallback


class GpusBusyError(InfrastructureError):
    """GPUs we were asked to use are taken: other processes' memory, or another autotuner."""


class GpuLockedError(GpusBusyError):
    """Another autotuner process is using one of the GPUs."""

    def __init__(self, uuid: str, index: int, holder: str, path: Path) -> None:
        self.uuid, self.index, self.holder, self.path = uuid, index, holder, path
        super().__init__(
            f"GPU {index} ({uuid}) is in use by another autotuner (pid {holder}; lock {path}): wait for it "
            "to finish, or pick other GPUs with engine.gpus")


def lock_path(uuid: str, directory: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", uuid)
    return (directory or lock_dir()) / f"{safe}.lock"


def _ensure_lock_dir(directory: Path) -> None:
    """The shared directory, created 1777; an existing one must be a real directory owned by root or by
    us, or sticky (else another user could swap our lock files for theirs)."""
    try:
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, SHARED_MODE)  # mkdir's mode passes through the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise InfrastructureError(f"cannot create the GPU lock directory {directory}: {exc.strerror}; set "
                                  f"{LOCK_DIR_ENV} to a directory every tuner on this machine can write") from exc
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise InfrastructureError(f"the GPU lock directory {directory} is not a directory (a symlink or file); "
                                  f"remove it, or set {LOCK_DIR_ENV}")
    if st.st_uid not in (0, os.geteuid()) and not st.st_mode & stat.S_ISVTX:
        raise InfrastructureError(f"the GPU lock directory {directory} belongs to uid {st.st_uid} and is not "
                                  f"sticky: its locks are not to be trusted; remove it, or set {LOCK_DIR_ENV}")


class GpuInUseError(GpusBusyError):
    """Another trial of this process has an engine on the GPU (a scheduling fault, never expected)."""


class GpuLocks(HeldLock):
    """Exclusive locks on GPUs given as (index, uuid); `acquire` takes all or none. `engine`: the locks of
    one engine's lifetime, which no other engine of this process may share."""

    def __init__(self, gpus: Iterable[tuple[int, str]], lock_dir: Path | None = None, engine: bool = False) -> None:
        """`lock_dir`: the machine's (`lock_dir()`) unless given (tests)."""
        # A fixed order (by UUID) so that two tuners wanting overlapping sets never deadlock.
        self.gpus = sorted(set(gpus), key=lambda g: g[1])
        self.lock_dir = lock_dir
        self.engine = engine
        self._paths: list[Path] = []
        self._engine_paths: list[Path] = []

    def acquire(self, wait_s: float = 0.0) -> None:
        """Raise GpuLockedError naming the holder if a GPU stays locked for `wait_s` seconds."""
        deadline = time.monotonic() + wait_s
        try:
            for index, uuid in self.gpus:
                path = lock_path(uuid, self.lock_dir)
                with _held_lock:
                    if self.engine:
                        if path in _engines:
                            raise GpuInUseError(f"GPU {index} ({uuid}) already runs an engine of this autotuner "
                                                "(another trial's): two engines never share a GPU")
                        _engines.add(path)
                        self._engine_paths.append(path)
                    if path in _held:
                        _held[path][1] += 1
                        self._paths.append(path)
                        continue
                fd = _flock(path, index, uuid, deadline)
                with _held_lock:
                    _held[path] = [fd, 1]
                self._paths.append(path)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        with _held_lock:
            while self._engine_paths:
                _engines.discard(self._engine_paths.pop())
        while self._paths:
            path = self._paths.pop()
            with _held_lock:
                entry = _held.get(path)
                if entry is None:
                    continue
                entry[1] -= 1
                if entry[1] > 0:
                    continue
                del _held[path]
            release(entry[0])  # closing drops the flock


def _flock(path: Path, index: int, uuid: str, deadline: float) -> int:
    _ensure_lock_dir(path.parent)
    while True:
        try:
            fd, ours = open_shared_lock_file(path)
        except OSError as exc:
            raise InfrastructureError(f"GPU {index} ({uuid}): cannot open its lock {path}: {exc}; remove the file, "
                                      f"or set {LOCK_DIR_ENV}") from exc
        if lock_now(fd):
            if ours:
                write_holder(fd)
            return fd
        holder = holder_of(fd)
        os.close(fd)
        if time.monotonic() >= deadline:
            raise GpuLockedError(uuid, index, holder, path) from None
        time.sleep(POLL_S)
