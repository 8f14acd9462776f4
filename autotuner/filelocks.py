"""Exclusive `flock`s on files: the one way autotuner takes a lock between processes.

A held lock is an open file descriptor: the kernel drops the `flock` when it is closed or its
process dies, so a killed holder never leaves a stale lock. Lock files may carry the holder's PID
(`write_holder` / `read_holder`) for the message the next process prints. Two shapes: `exclusive`
waits for the lock (short critical sections: a counter, a state file), `try_exclusive` returns at
once (a lock held for a whole run: the study database, a GPU).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from autotuner.errors import InfrastructureError


def open_lock_file(path: Path, mode: int = 0o644) -> int:
    """The lock file opened read-write (created with `mode` if missing); raises OSError."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)


@contextlib.contextmanager
def exclusive(path: Path, mode: int = 0o644) -> Iterator[int]:
    """Hold an exclusive lock on `path`, waiting for it; yields the open descriptor (read-write)."""
    fd = open_lock_file(path, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing drops the flock


def try_exclusive(path: Path, mode: int = 0o644) -> int | None:
    """Take an exclusive lock on `path` without waiting: the descriptor that holds it (close it, or
    `release` it, to let go), or None when another process holds it. Raises OSError when the file
    cannot be opened."""
    fd = open_lock_file(path, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class UnsafeLockFileError(InfrastructureError, OSError):
    """A lock file in a shared directory is not a plain file of its own (a symlink, a hard link, a FIFO)."""


def open_shared_lock_file(path: Path) -> tuple[int, bool]:
    """A lock file in a directory every user may write (sticky, like /tmp), so that tuners of different
    users exclude each other. Never followed through a symlink and only a regular file with one link: a
    planted link must not make us truncate what it names. Made readable by all, since another user's
    tuner takes the same `flock` on a read-only descriptor. Returns (fd, ours): `ours` when this user
    owns the file, so it may carry our PID. Raises OSError (UnsafeLockFileError for a planted file)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
        writable = True
    except PermissionError:  # another user's file: theirs to write, ours to lock
        fd = os.open(path, os.O_RDONLY | flags)
        writable = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise UnsafeLockFileError(f"{path} is not a plain lock file (a link or special file); remove it")
        ours = writable and st.st_uid == os.geteuid()
        if ours and stat.S_IMODE(st.st_mode) != 0o644:
            os.fchmod(fd, 0o644)  # the umask may have taken other users' read bit
    except BaseException:
        os.close(fd)
        raise
    return fd, ours


def lock_now(fd: int) -> bool:
    """Take an exclusive `flock` on an open descriptor without waiting; False when another holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder_of(fd: int) -> str:
    """The PID a lock file's holder recorded, read through our own descriptor (never by path)."""
    try:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def write_holder(fd: int) -> None:
    """Record this process as the holder (its PID, the file's whole content)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def read_holder(path: Path) -> str:
    """The PID the holder of `path` recorded, or "?" when it is unknown."""
    try:
        return path.read_bytes()[:64].decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def release(fd: int) -> None:
    """Let go of a lock from `try_exclusive`, clearing the holder's PID first."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)


class HeldLock(ABC):
    """A lock held for a stretch of a run (the study database, a trial's GPUs): `acquire` raises when it is
    taken, `release` lets go (and may be called when not held); `with` does both."""

    @abstractmethod
    def acquire(self) -> None: ...

    @abstractmethod
    def release(self) -> None: ...

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
