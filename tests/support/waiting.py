"""The one polling helper: wait until a condition holds, or fail the test naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str = "the condition", interval: float = 0.05) -> T:
    """`check()`'s first truthy value. At the deadline the test fails (AssertionError naming `what` and the
    last value seen); it never passes there."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def seconds_until(check: Callable[[], object], timeout: float, what: str = "the condition",
                  interval: float = 0.01) -> float:
    """How long `check()` took to hold (for tests that bound a delay); fails like `wait_for`."""
    start = time.monotonic()
    wait_for(check, timeout, what, interval)
    return time.monotonic() - start
