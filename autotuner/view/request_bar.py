"""A progress bar over a replay's requests for `measure` and `verify` on a terminal: completed / total
and output tokens/s so far, per phase (warm-up, then the measured workload)."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from autotuner.workload.replay import request_listener


class RequestBar:
    """The replay's `request_listener` while entered."""

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description:<8}"), BarColumn(bar_width=30),
                                 MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                 TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                 console=console or Console(stderr=True), transient=False)
        self.tasks: dict[str, TaskID] = {}
        self._token: Any = None

    def __enter__(self) -> RequestBar:
        self.progress.__enter__()
        self._token = request_listener.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        request_listener.reset(self._token)
        self.progress.__exit__(None, None, None)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind != "request":
            return
        phase = data["phase"]
        if phase not in self.tasks:
            self.tasks[phase] = self.progress.add_task(phase, total=data["total"], rate="", failed="")
        rate = data.get("output_tokens_per_s")
        failed = data.get("failed") or 0
        self.progress.update(self.tasks[phase], completed=data["done"], total=data["total"],
                             rate="" if rate is None else f"{rate:,.0f} tok/s",
                             failed=f"[red]{failed} failed[/]" if failed else "")


def request_bar(enabled: bool | None = None) -> AbstractContextManager[object]:
    """A RequestBar on a terminal (stderr), nothing when piped."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    return RequestBar() if enabled else nullcontext()
