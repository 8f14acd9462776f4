"""What a running study shows: a live panel on a terminal, one structured log line per event
otherwise (the loop logs those itself)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table


class LiveView:
    """trial n of N, current flags, phase, elapsed and remaining budget, best so far, OOM count."""

    def __init__(self, objectives: list[str], timeout_s: float | None, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.objectives = objectives
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.state: dict[str, Any] = {"index": 0, "budget": 0, "flags": {}, "phase": "-", "oom": 0,
                                      "feasible": 0, "best": None, "last": "-"}
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.__exit__(None, None, None)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        s = self.state
        if kind == "started":
            s.update(study=data["study"], sampler=data["sampler"], budget=data["budget"])
        elif kind == "trial":
            s.update(index=data["index"], budget=data["budget"], flags=data["flags"], phase="starting",
                     kind=data["kind"])
        elif kind == "phase":
            s["phase"] = data["phase"]
        elif kind == "finished":
            outcome = data.get("outcome")
            s["last"] = f"#{data['number']} {outcome}"
            if outcome in ("oom-threshold", "oom-crash"):
                s["oom"] += 1
            if data.get("feasible"):
                s["feasible"] += 1
                values = data.get("values") or []
                if values and (s["best"] is None or values[0] > s["best"][0]):
                    s["best"] = values
            s["phase"] = "-"
        self.live.update(self._render())

    def _render(self) -> Table:
        s = {k: escape(v) if isinstance(v, str) else v for k, v in self.state.items()}
        elapsed = time.monotonic() - self.started
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("study", f"{s.get('study', '-')}  ({s.get('sampler', '')})")
        table.add_row("trial", f"{s['index']} of {s['budget']}  ({s.get('kind', '')})  phase: {s['phase']}")
        table.add_row("flags", escape(" ".join(f"{k}={v}" for k, v in s["flags"].items())) or "-")
        remaining = "-" if self.timeout_s is None else f"{max(0.0, self.timeout_s - elapsed):.0f} s"
        table.add_row("time", f"elapsed {elapsed:.0f} s, remaining budget {remaining}")
        best = s["best"]
        shown = "-" if best is None else ", ".join(f"{n}={v:.3g}" for n, v in zip(self.objectives, best, strict=False))
        table.add_row("best", shown)
        table.add_row("feasible / OOM", f"{s['feasible']} / {s['oom']}   last: {s['last']}")
        return table
