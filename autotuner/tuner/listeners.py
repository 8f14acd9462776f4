"""The live view's memory and request listeners, told which trial they hear: trials side by side
each set their own in their task's context, so every event carries its trial's number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotuner.monitor.sampler import memory_listener
from autotuner.workload.replay import request_listener

Event = Callable[[str, dict[str, Any]], None]


class _Tagged:
    """A listener that adds the trial's number to what it hears."""

    def __init__(self, listener: Event, number: int) -> None:
        self.listener, self.number = listener, number

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.listener(kind, {**data, "number": self.number})


def listen_as(number: int) -> None:
    """From now on in this task's context, the listeners hear trial `number`."""
    for var in (memory_listener, request_listener):
        heard = var.get()
        if heard is not None:
            var.set(_Tagged(heard, number))  # type: ignore[arg-type]
