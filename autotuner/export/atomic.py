"""Writes that are all or nothing: a reader (or a deploy script) never sees half a file, and a failure
leaves what was there before."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from autotuner.errors import UserInputError

# Exports, measurements and reports hold run details: readable by their owner only, whatever the umask.
PRIVATE_MODE = 0o600


def final_target(path: Path) -> Path:
    """The file a write replaces: a symlink is followed to the file it names, so the link stays a link
    (an operator's /etc/vllm/config.yaml -> /srv/... keeps pointing where they pointed it) and the
    target gets the new text, atomically, in its own directory."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_output_file(path: Path, force: bool = False) -> None:
    """Bad paths are the user's to fix, before any work is done. An existing file (or a symlink, even a
    dangling one) is replaced only with `force`."""
    if path.is_dir():
        raise UserInputError(f"-o {path}: is a directory; give a file name")
    target = final_target(path)
    if not target.parent.is_dir():
        shown = f"{target.parent} (where the symlink {path} points)" if target != path else str(path.parent)
        raise UserInputError(f"-o {path}: directory {shown} does not exist")
    if os.path.lexists(path) and not force:
        raise UserInputError(f"-o {path}: exists; pass --force to replace it, or choose another file")


def replacement_mode(path: Path) -> int:
    """The mode a replaced file keeps: its own where stricter than PRIVATE_MODE (a 0400 stays 0400), else
    PRIVATE_MODE (a 0644 becomes 0600); a new file gets PRIVATE_MODE."""
    try:
        return stat.S_IMODE(final_target(path).stat().st_mode) & PRIVATE_MODE
    except FileNotFoundError:
        return PRIVATE_MODE


# SIGTERM and SIGHUP kill a process that has no handler for them without running `finally`; a signal
# between creating the temp file and renaming it would leave the temp file behind.
_TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Holds SIGINT, SIGTERM and SIGHUP back for the block; one that arrived meanwhile is delivered when it
    ends, after the temp file is renamed or removed.

    In the main thread the handlers are swapped for one that notes the signal: a process-directed signal
    may be taken by any thread (a library's worker thread too), and only a handler catches it wherever it
    lands. Elsewhere (a worker thread, where handlers cannot be set) the thread blocks them."""
    if threading.current_thread() is not threading.main_thread():
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINATING)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: arrived.append(signum)) for sig in _TERMINATING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if arrived:
            signal.raise_signal(arrived[0])  # as it would have been handled: exit, KeyboardInterrupt, a handler


def write_text_atomic(path: Path, text: str, mode: int = PRIVATE_MODE) -> None:
    """Temp file in the same directory (same filesystem, so the rename is atomic), fsync, rename. A
    symlink at `path` is followed: its target is replaced (see `final_target`)."""
    path = final_target(path)
    with deferred_signals():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def check_output_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UserInputError(f"-o {path}: exists and is not a directory")
    if not path.parent.is_dir():
        raise UserInputError(f"-o {path}: directory {path.parent} does not exist")


@contextlib.contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """A temp directory beside `target` to write into; on success its files move into `target` (the
    whole directory is renamed when `target` does not exist yet), on failure it is removed. A termination
    signal while the files are written waits until the stage is moved or removed."""
    with deferred_signals():
        stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            yield stage
            if not target.exists():
                stage.chmod(0o755)  # mkdtemp's 0700 is for the staging only
                os.replace(stage, target)
                return
            # An existing directory keeps its other files; each of ours replaces its namesake atomically.
            for item in stage.iterdir():
                os.replace(item, target / item.name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
