"""Files that can hold run details (the SQLite study database the tuner creates, the JSONL logs, the
engines' and deploy commands' logs) are created readable by their owner only, whatever the umask: 0600
files in 0700 directories. An engine's log quotes its command line and whatever it prints; a database
holds the scenario and every reason.

Only files we create get these modes: an existing file keeps the mode its owner gave it (a database
shared on purpose stays shared).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, TextIO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """`path` and its missing parents created 0700 (those that exist are left as they are)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def _open_fd(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT, FILE_MODE)  # the mode applies only when it is created


def append_text(path: Path) -> TextIO:
    """`path` opened for appending text, created 0600 when missing (its directory 0700)."""
    private_dir(path.parent)
    return os.fdopen(_open_fd(path, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8")


def append_binary(path: Path) -> BinaryIO:
    """`path` opened for appending bytes, created 0600 when missing (its directory 0700)."""
    private_dir(path.parent)
    return os.fdopen(_open_fd(path, os.O_WRONLY | os.O_APPEND), "ab")


def create_empty(path: Path) -> None:
    """An empty 0600 file at `path` unless one exists: SQLite then keeps that mode for the database and
    gives it to its -wal and -shm files."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        return
