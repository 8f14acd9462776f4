"""The one flock helper (autotuner/filelocks.py): a try-lock that says "held" instead of waiting, a
blocking lock for short critical sections, and the holder's PID for the message."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from autotuner.filelocks import exclusive, read_holder, release, try_exclusive, write_holder


def test_a_held_lock_is_refused_without_waiting_and_names_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    fd = try_exclusive(path)
    assert fd is not None
    write_holder(fd)
    # flock belongs to the open file: a second open of the same file, even in this process, is refused.
    assert try_exclusive(path) is None
    assert read_holder(path) == str(os.getpid())
    release(fd)
    assert read_holder(path) == "?"  # released: no holder on record
    again = try_exclusive(path)
    assert again is not None
    release(again)


def test_exclusive_waits_for_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "b.lock"
    fd = try_exclusive(path)
    assert fd is not None
    got: list[float] = []

    def wait() -> None:
        with exclusive(path):
            got.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    assert not got, "the lock is held: exclusive must wait"
    let_go = time.monotonic()
    release(fd)
    waiter.join(timeout=5)
    assert got and got[0] >= let_go


def test_an_unknown_holder_reads_as_a_question_mark(tmp_path: Path) -> None:
    assert read_holder(tmp_path / "missing.lock") == "?"
