"""One tuner per SQLite study database: an exclusive lock on `<database>.lock` for the whole run,
holding the tuner's PID for the message a second tuner prints. Several boxes share one study through
PostgreSQL instead (no lock: Optuna's heartbeats tell a dead worker's trials from a live one's).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotuner.errors import UserInputError
from autotuner.filelocks import HeldLock, read_holder, try_exclusive, write_holder
from autotuner.store.db import Store


class StudyLock(HeldLock):
    def __init__(self, store: Store) -> None:
        self.store = store
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises UserInputError when another tuner holds the database or the lock cannot be created."""
        if not self.store.is_sqlite:
            return
        path = Path(self.store.url.removeprefix("sqlite:///") + ".lock")
        try:
            fd = try_exclusive(path)
        except OSError as exc:
            raise UserInputError(f"storage {path.with_suffix('')}: cannot create its lock file {path}: "
                                 f"{exc.strerror}; the study database and its directory must be writable "
                                 "(or use another --storage)") from None
        if fd is None:
            raise UserInputError(f"another autotuner (pid {read_holder(path)}) is tuning with "
                                 f"{path.with_suffix('')}; wait for it, or use another --storage")
        write_holder(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
