"""One lock per GPU, across every tuner on this box: `$AUTOTUNER_HOME/locks/<GPU UUID>.lock`, held
with `flock` from the check that the GPU is free until our engine on it has stopped and its memory
is back. Two tuners with different databases (or `measure` beside `tune`) never share a GPU.

The kernel drops an `flock` when its holder dies, so a killed tuner never leaves a stale lock; the
file keeps the holder's PID, for the message the next one prints. Within one process the locks are
re-entrant (the study holds its GPUs for the whole run, each trial takes them again), since two
`flock`s of one file from one process would block each other. Trials side by side in one process
take theirs as `engine` locks: at most one engine holds a GPU, also among this process's trials.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from autotuner.engine.registry import autotuner_home
from autotuner.errors import InfrastructureError
from autotuner.filelocks import HeldLock, read_holder, release, try_exclusive, write_holder

LOCKS_DIR = "locks"
POLL_S = 0.1

_held_lock = threading.Lock()
_held: dict[Path, list[int]] = {}  # lock file -> [fd, holds] in this process
_engines: set[Path] = set()  # lock files an engine of this process holds (trials side by side)


class GpusBusyError(InfrastructureError):
    """GPUs we were asked to use are taken: other processes' memory, or another autotuner."""


class GpuLockedError(GpusBusyError):
    """Another autotuner process is using one of the GPUs."""

    def __init__(self, uuid: str, index: int, holder: str, path: Path) -> None:
        self.uuid, self.index, self.holder, self.path = uuid, index, holder, path
        super().__init__(
            f"GPU {index} ({uuid}) is in use by another autotuner (pid {holder}; lock {path}): wait for it "
            "to finish, or pick other GPUs with engine.gpus")


def lock_path(uuid: str, home: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", uuid)
    return (home or autotuner_home()) / LOCKS_DIR / f"{safe}.lock"


class GpuInUseError(GpusBusyError):
    """Another trial of this process has an engine on the GPU (a scheduling fault, never expected)."""


class GpuLocks(HeldLock):
    """Exclusive locks on GPUs given as (index, uuid); `acquire` takes all or none. `engine`: the locks of
    one engine's lifetime, which no other engine of this process may share."""

    def __init__(self, gpus: Iterable[tuple[int, str]], home: Path | None = None, engine: bool = False) -> None:
        # A fixed order (by UUID) so that two tuners wanting overlapping sets never deadlock.
        self.gpus = sorted(set(gpus), key=lambda g: g[1])
        self.home = home
        self.engine = engine
        self._paths: list[Path] = []
        self._engine_paths: list[Path] = []

    def acquire(self, wait_s: float = 0.0) -> None:
        """Raise GpuLockedError naming the holder if a GPU stays locked for `wait_s` seconds."""
        deadline = time.monotonic() + wait_s
        try:
            for index, uuid in self.gpus:
                path = lock_path(uuid, self.home)
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
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    while (fd := try_exclusive(path, 0o600)) is None:
        if time.monotonic() >= deadline:
            raise GpuLockedError(uuid, index, read_holder(path), path) from None
        time.sleep(POLL_S)
    write_holder(fd)
    return fd
