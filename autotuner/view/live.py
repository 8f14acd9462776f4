"""What a running study shows on a terminal: progress bars, the trial in flight with a memory gauge per
GPU, and a table of finished trials (the full log is in a file; see autotuner.logs).

`LiveView` is a Tuner's `on_event` (events "started", "trial", "phase", "memory", "finished",
"stopped") and renders with Rich; `render()` is what a test snapshots, with its own clock.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autotuner.analysis.wording import bare_reason, outcome_label, shorten
from autotuner.units import flag_value

GIB = float(1 << 30)
OOM = ("oom-threshold", "oom-crash")
# Searched flags as column headers, short enough for 100 columns.
SHORT_FLAG = {"max-num-batched-tokens": "batched tok", "gpu-memory-utilization": "gpu util",
              "cpu-offload-gb": "offload GB", "max-num-seqs": "max seqs", "kv-cache-dtype": "kv dtype",
              "swap-space": "swap GB", "block-size": "block"}
# Why an "ok" trial is not feasible, from the Tuner's constraint names.
MISSED = {"slo": "misses an SLO", "requests": "too many failed requests", "memory": "memory over the threshold",
          "startup": "did not start"}
# Lines above the trial table (bars, current trial, GPUs) and its own chrome; the rest is rows.
_TABLE_CHROME = 5


@dataclass
class FinishedRow:
    number: int
    kind: str
    flags: dict[str, Any]
    outcome: str
    feasible: bool
    values: list[float] | None
    output_tps: float | None
    ttft_p95_s: float | None
    peak_fraction: float | None
    reason: str


@dataclass
class Current:
    number: int
    index: int
    kind: str
    flags: dict[str, Any]
    phase: str = "starting"
    started: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, Any] = field(default_factory=dict)
    gpus: str = "-"  # its GPU group when trials run side by side


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def pareto_numbers(rows: Sequence[FinishedRow], directions: Sequence[str]) -> set[int]:
    """Feasible trials no other feasible trial beats on every objective."""
    signs = [1.0 if d == "maximize" else -1.0 for d in directions]
    points = [(r.number, [s * v for s, v in zip(signs, r.values, strict=False)]) for r in rows
              if r.feasible and r.values]

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=False)) and any(x > y for x, y in zip(a, b, strict=False))

    return {n for n, p in points if not any(dominates(q, p) for m, q in points if m != n)}


def _reason(data: dict[str, Any]) -> str:
    """The first line of the trial's reason; for an "ok" trial that is not feasible, which limit it missed."""
    reason = bare_reason((str(data.get("reason") or "").strip().splitlines() or [""])[0])
    if reason or data.get("feasible") or data.get("outcome") != "ok":
        return reason
    missed = [MISSED.get(k, k) for k, v in (data.get("constraints") or {}).items() if v > 0]
    return "infeasible: " + ", ".join(missed) if missed else ""


class LiveView:
    def __init__(self, objectives: list[str], directions: list[str], timeout_s: float | None,
                 console: Console | None = None, clock: Callable[[], float] = time.monotonic,
                 live: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.objectives = objectives
        self.directions = directions
        self.timeout_s = timeout_s
        self.clock = clock
        self.started = clock()
        self.study = "-"
        self.sampler = ""
        self.budget = 0
        self.done = 0
        self.currents: dict[int, Current] = {}  # trials in flight (several on disjoint GPU groups)
        self.groups: list[str] = []
        self.rows: list[FinishedRow] = []
        self.durations: list[float] = []
        self.searched: list[str] = []
        self.stopped: str | None = None
        self._flags_of: dict[int, dict[str, Any]] = {}
        self._kind_of: dict[int, str] = {}
        self._gpus_of: dict[int, str] = {}
        self._lock = threading.Lock()  # memory events come from the sampler thread
        self.live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4,
                         transient=False) if live else None

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.__exit__(None, None, None)

    @property
    def current(self) -> Current | None:
        """The trial started last, of those in flight."""
        return self.currents[max(self.currents)] if self.currents else None

    def _of(self, data: dict[str, Any]) -> Current | None:
        number = data.get("number")
        return self.currents.get(number) if number is not None else self.current

    # --- events ----------------------------------------------------------------------------------------
    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        with self._lock:
            self._hear(kind, data)
        if self.live is not None and kind not in ("memory", "request"):
            self.live.refresh()

    def _hear(self, kind: str, data: dict[str, Any]) -> None:
        now = self.clock()
        if kind == "started":
            self.study, self.sampler, self.budget = data["study"], data.get("sampler", ""), data["budget"]
            self.groups = list(data.get("gpu_groups") or [])
        elif kind == "trial":
            self.done = data.get("done", data["index"] - 1)
            self.budget = data.get("budget", self.budget)
            flags = dict(data.get("flags") or {})
            self.searched = self.searched or list(flags)
            self._flags_of[data["number"]] = flags
            self._kind_of[data["number"]] = data.get("kind", "search")
            self._gpus_of[data["number"]] = str(data.get("gpus") or "-")
            self.currents[data["number"]] = Current(data["number"], data["index"], data.get("kind", "search"), flags,
                                                    started=now, gpus=str(data.get("gpus") or "-"))
        elif kind in ("phase", "memory", "request") and (c := self._of(data)) is not None:
            if kind == "phase":
                c.phase = data["phase"]
            elif kind == "memory":
                c.memory = data
            else:
                c.requests = data
        elif kind == "finished":
            self._finished(data, now)
        elif kind == "stopped":
            self.stopped = data.get("reason")

    def _finished(self, data: dict[str, Any], now: float) -> None:
        number = data["number"]
        current = self.currents.pop(number, None)
        if current is not None and data.get("outcome") != "interrupted":
            self.done = self.done + 1 if self.groups else current.index
            if current.memory or current.phase != "starting":  # an engine ran: its time predicts the next
                self.durations.append(now - current.started)
        metrics = data.get("metrics") or {}
        peak = data.get("peak_fraction")
        if peak is None and current is not None and current.memory.get("total_bytes"):
            m = current.memory
            peak = max(p / t for p, t in zip(m["peak_bytes"], m["total_bytes"], strict=False) if t)
        self.rows.append(FinishedRow(
            number=number, kind=data.get("kind") or self._kind_of.get(number, "search"),
            flags=self._flags_of.get(number, {}), outcome=outcome_label(str(data.get("outcome")), data.get("reason")),
            feasible=bool(data.get("feasible")),
            values=data.get("values") if data.get("feasible") else None,
            output_tps=metrics.get("output_tokens_per_s"), ttft_p95_s=metrics.get("ttft_p95_s"),
            peak_fraction=peak, reason=_reason(data)))

    # --- rendering -------------------------------------------------------------------------------------
    def render(self) -> RenderableType:
        with self._lock:
            parts: list[RenderableType] = [self._bars()]
            parts.append(self._current())
            parts.append(self._table())
        return Group(*parts)

    def _eta(self, now: float) -> float | None:
        if not self.durations:
            return None
        median = statistics.median(self.durations)
        left = max(0, self.budget - self.done) * median
        for c in self.currents.values():
            left -= min(median, now - c.started)
        left /= max(1, len(self.groups))
        if self.timeout_s is not None:
            left = min(left, max(0.0, self.timeout_s - (now - self.started)))
        return max(0.0, left)

    def _bars(self) -> Table:
        now = self.clock()
        elapsed = now - self.started
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True, min_width=6)
        grid.add_column(width=30)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        median = f"median trial {clock_text(statistics.median(self.durations))}" if self.durations else "median -"
        grid.add_row("trials", ProgressBar(total=max(1, self.budget), completed=self.done, width=30),
                     f"{self.done}/{self.budget}  elapsed {clock_text(elapsed)}  ETA {clock_text(self._eta(now))}"
                     f"  ({median})")
        if self.timeout_s is not None:
            grid.add_row("budget", ProgressBar(total=self.timeout_s, completed=min(elapsed, self.timeout_s), width=30),
                         f"{clock_text(elapsed)} of {clock_text(self.timeout_s)}  left "
                         f"{clock_text(max(0.0, self.timeout_s - elapsed))}")
        return grid

    def _current(self) -> RenderableType:
        head = Text.assemble(("study ", "bold"), self.study, f" ({self.sampler})" if self.sampler else "")
        if self.stopped:
            head.append(f"  stopped: {self.stopped}", style="bold red")
        head.no_wrap = True
        head.truncate(self.console.width, overflow="ellipsis")
        if not self.currents:
            return Group(head, Text("trial  -", style="dim"))
        lines: list[RenderableType] = [head]
        for c in sorted(self.currents.values(), key=lambda c: c.number):
            lines += self._one_current(c)
        return Group(*lines)

    def _one_current(self, c: Current) -> list[RenderableType]:
        flags = " ".join(f"{k}={flag_value(v)}" for k, v in c.flags.items())
        r = c.requests
        served = "" if not r else f" {r['done']}/{r['total']} requests" + (
            f" {r['output_tokens_per_s']:,.0f} tok/s" if r.get("output_tokens_per_s") else "")
        line = Text.assemble(("trial ", "bold"), f"#{c.number} ({c.kind})  ",
                             ("GPUs ", "bold") if self.groups else "", f"{c.gpus}  " if self.groups else "",
                             ("phase ", "bold"),
                             (c.phase + served, "cyan"), f"  {clock_text(self.clock() - c.started)}  ", flags)
        line.truncate(self.console.width, overflow="ellipsis")
        return [line, *self._gauges(c.memory)]

    def _gauges(self, m: dict[str, Any]) -> list[RenderableType]:
        if not m.get("total_bytes"):
            return []
        out: list[RenderableType] = []
        limits = m.get("limit_bytes") or [None] * len(m["total_bytes"])
        for gpu, used, peak, total, limit in zip(m.get("gpus") or range(len(m["total_bytes"])), m["used_bytes"],
                                                 m["peak_bytes"], m["total_bytes"], limits, strict=False):
            style = "red" if limit and peak >= 0.95 * limit else ("yellow" if limit and peak >= 0.85 * limit
                                                                  else "green")
            grid = Table.grid(padding=(0, 1))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column(width=30)
            grid.add_column(no_wrap=True)
            threshold = f", threshold {limit / GIB:.1f} GiB" if limit else ""
            grid.add_row(f"GPU {gpu}", ProgressBar(total=total, completed=peak, width=30, complete_style=style,
                                                    finished_style=style),
                         f"peak {peak / GIB:.1f} of {total / GIB:.1f} GiB ({peak / total:.0%}){threshold}"
                         f"  now {used / GIB:.1f}")
            out.append(grid)
        return out

    def _table(self) -> Table:
        front = pareto_numbers(self.rows, self.directions)
        best = self._best()
        headers = ["#", "kind", *(["GPUs"] if self.groups else []), *(SHORT_FLAG.get(f, f) for f in self.searched),
                   "outcome", "out tok/s", "TTFT p95", "mem"]
        rows = []
        for row in self.rows[-self._room():]:
            rows.append((row, [
                f"{'*' if row.number in front else ' '}{row.number}", row.kind,
                *([self._gpus_of.get(row.number, "-")] if self.groups else []),
                *(flag_value(row.flags[f]) if f in row.flags else "-" for f in self.searched),
                row.outcome,
                "-" if row.output_tps is None else f"{row.output_tps:.0f}",
                "-" if row.ttft_p95_s is None else f"{row.ttft_p95_s:.2f} s",
                "-" if row.peak_fraction is None else f"{row.peak_fraction:.0%}"]))
        # The reason gets what the other columns leave: Rich would squeeze every column instead.
        used = sum(max([cell_len(h)] + [cell_len(cells[i]) for _, cells in rows]) + 1 for i, h in enumerate(headers))
        reason_width = max(6, self.console.width - used - 1)
        table = Table(box=None, padding=(0, 1, 0, 0), header_style="bold", pad_edge=False,
                      caption="* Pareto front   bold: best feasible" if front else None, caption_justify="left")
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 1 or header == "outcome" else "right", no_wrap=True)
        table.add_column("reason", no_wrap=True, overflow="ellipsis", max_width=reason_width)
        for row, cells in rows:
            style = "bold green" if row.number == best else None
            outcome_style = "green" if row.outcome == "ok" else ("red" if row.outcome in OOM else "yellow")
            outcome_at = len(headers) - 4
            texts: list[str | Text] = list(cells)
            texts[outcome_at] = Text(row.outcome, style=outcome_style)
            reason = row.reason if cell_len(row.reason) <= reason_width else shorten(row.reason, reason_width)
            table.add_row(*texts, reason, style=style)
        return table

    def _room(self) -> int:
        """Rows that fit: the last screenful scrolls, the rest is in `autotuner status`."""
        above = 4 + (1 if self.timeout_s is not None else 0)
        for c in self.currents.values():
            above += 1 + len(c.memory.get("total_bytes") or [])
        above -= 1 if self.currents else 0
        return max(3, self.console.size.height - above - _TABLE_CHROME)

    def _best(self) -> int | None:
        feasible = [r for r in self.rows if r.feasible and r.values]
        if not feasible or not self.directions:
            return None
        sign = 1.0 if self.directions[0] == "maximize" else -1.0
        return max(feasible, key=lambda r: sign * r.values[0]).number  # type: ignore[index]
