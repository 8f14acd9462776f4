"""The live view of `tune`, rendered from a recorded sequence of events into a fixed-width console
with a fake clock: the text is the snapshot, timing plays no part."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from autotuner.view.live import LiveView, pareto_numbers

SNAPSHOTS = Path(__file__).parent / "snapshots"
GIB = 1 << 30
SEARCHED = ("max-num-batched-tokens", "gpu-memory-utilization")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def memory(peak_gib: list[float], used_gib: list[float]) -> dict[str, Any]:
    return {"used_bytes": [int(u * GIB) for u in used_gib], "peak_bytes": [int(p * GIB) for p in peak_gib],
            "total_bytes": [80 * GIB] * len(peak_gib), "limit_bytes": [int(77.6 * GIB)] * len(peak_gib),
            "gpus": list(range(len(peak_gib)))}


def trial(number: int, batched: int, util: float, kind: str = "search") -> dict[str, Any]:
    return {"number": number, "index": number + 1, "budget": 20, "kind": kind,
            "flags": {SEARCHED[0]: batched, SEARCHED[1]: util}}


def finished(number: int, outcome: str, feasible: bool, tps: float | None, ttft: float | None, peak: float,
             reason: str | None = None) -> dict[str, Any]:
    metrics = {} if tps is None else {"output_tokens_per_s": tps, "ttft_p95_s": ttft}
    return {"number": number, "outcome": outcome, "feasible": feasible, "state": "COMPLETE", "reason": reason,
            "values": [tps, ttft] if feasible else [0.0, 60.0], "metrics": metrics, "peak_fraction": peak}


def recorded(clock: Clock) -> list[tuple[float, str, dict[str, Any]]]:
    """(seconds after the previous event, kind, data), as a Tuner and the sampler send them."""
    oom = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB\n"
           "Traceback (most recent call last):\n  File ...")
    return [
        (0, "started", {"study": "quickstart-3f2a", "sampler": "TPESampler", "budget": 20, "requeued": []}),
        (0, "trial", trial(0, 2048, 0.9, "baseline")),
        (5, "phase", {"phase": "warm-up"}),
        (1, "memory", memory([61.0, 60.5], [60.0, 60.0])),
        (20, "phase", {"phase": "workload"}),
        (30, "phase", {"phase": "stopping"}),
        (4, "finished", finished(0, "ok", True, 1510.4, 0.84, 0.78)),
        (0, "trial", trial(1, 16384, 0.97)),
        (50, "finished", finished(1, "oom-threshold", False, None, None, 0.971, oom)),
        (0, "trial", trial(2, 8192, 0.93)),
        (70, "finished", finished(2, "ok", True, 2380.0, 1.21, 0.91)),
        (0, "trial", trial(3, 4096, 0.92)),
        (60, "finished", finished(3, "ok", True, 1902.5, 0.62, 0.86)),
        (0, "trial", trial(4, 6144, 0.90)),
        (62, "finished", {**finished(4, "ok", False, 1800.0, 12.5, 0.84),
                          "constraints": {"memory": -0.1, "startup": -1.0, "requests": -1.0, "slo": 0.25}}),
        (0, "trial", trial(5, 12288, 0.95)),
        (3, "phase", {"phase": "warm-up"}),
        (10, "memory", memory([74.2, 73.9], [70.1, 70.0])),
        (15, "phase", {"phase": "workload"}),
    ]


def play(view: LiveView, clock: Clock) -> None:
    for delay, kind, data in recorded(clock):
        clock.t += delay
        view(kind, data)


def render(width: int, height: int = 40, timeout_s: float | None = 3600.0) -> str:
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None,
                      legacy_windows=False)
    clock = Clock()
    view = LiveView(["output_tokens_per_s", "ttft_p95_s"], ["maximize", "minimize"], timeout_s,
                    console=console, clock=clock, live=False)
    play(view, clock)
    console.print(view.render())
    return console.export_text()


def test_live_view_snapshot_at_100_columns() -> None:
    text = render(100)
    snapshot = SNAPSHOTS / "live_view_100.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") or not snapshot.exists():
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(text)
    assert text == snapshot.read_text()
    assert all(len(line) <= 100 for line in text.splitlines())


def test_live_view_shows_progress_eta_budget_current_trial_and_gauges() -> None:
    text = render(100)
    # 5 of 20 engine runs done; median of 60, 50, 70, 60, 62 s = 60 s; 15 left minus the 28 s running.
    assert "5/20" in text and "elapsed 0:05:30" in text and "median trial 0:01:00" in text
    assert "ETA 0:14:32" in text
    assert "0:05:30 of 1:00:00" in text and "left 0:54:30" in text
    assert "#5 (search)" in text and "phase workload" in text and "max-num-batched-tokens=12288" in text
    assert "GPU 0" in text and "GPU 1" in text and "peak 74.2 of 80.0 GiB (93%), threshold 77.6 GiB" in text


def test_finished_rows_mark_the_front_and_cut_the_reason_to_one_line() -> None:
    text = render(100)
    rows = {line.split()[0]: line for line in text.splitlines() if line.split() and
            line.split()[0].lstrip("*").isdigit()}
    # Front of (max tok/s, min TTFT): 2 (fastest), 3 (lowest TTFT); 3 beats 0 and 4 on both.
    assert set(rows) == {"0", "*2", "*3", "1", "4"}
    assert "oom-threshold" in rows["1"] and "CUDA out of memory" in rows["1"] and "Traceback" not in text
    assert "2380" in rows["*2"] and "1.21 s" in rows["*2"] and "91%" in rows["*2"]
    assert "Pareto front" in text
    assert "12.50 s" in rows["4"] and "infeasible: misses an SLO" in rows["4"]


def test_the_table_scrolls_keeping_the_last_rows_that_fit() -> None:
    text = render(100, height=14, timeout_s=None)
    assert "budget" not in text
    numbers = [line.split()[0] for line in text.splitlines() if line.split() and line.split()[0].lstrip("*").isdigit()]
    assert numbers == ["*2", "*3", "4"]  # 0 and 1 scrolled away


def test_wide_terminal_fits_the_whole_reason() -> None:
    text = render(200)
    assert "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB" in text


def test_pareto_numbers_ignore_infeasible_trials() -> None:
    from autotuner.view.live import FinishedRow

    def row(n: int, values: list[float] | None, ok: bool) -> FinishedRow:
        return FinishedRow(n, "search", {}, "ok", ok, values, None, None, None, "")

    rows = [row(0, [10, 1.0], True), row(1, [20, 2.0], True), row(2, [5, 2.0], True), row(3, [99, 0.1], False)]
    assert pareto_numbers(rows, ["maximize", "minimize"]) == {0, 1}


def test_the_best_feasible_row_is_highlighted() -> None:
    console = Console(width=100, height=40, file=io.StringIO(), color_system="standard", force_terminal=True)
    clock = Clock()
    view = LiveView(["output_tokens_per_s", "ttft_p95_s"], ["maximize", "minimize"], None, console=console,
                    clock=clock, live=False)
    play(view, clock)
    console.print(view.render())
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    best = next(line for line in lines if "2380" in line)
    other = next(line for line in lines if "1902" in line)
    assert "\x1b[1;32m" in best and "\x1b[1;32m" not in other


def test_trials_side_by_side_each_have_their_line_gauges_and_group() -> None:
    console = Console(width=120, height=40, file=io.StringIO(), record=True, color_system=None)
    clock = Clock()
    view = LiveView(["output_tokens_per_s", "ttft_p95_s"], ["maximize", "minimize"], None, console=console,
                    clock=clock, live=False)
    view("started", {"study": "s", "sampler": "TPE", "budget": 8, "requeued": [], "gpu_groups": ["0,1", "2,3"]})
    view("trial", {**trial(0, 2048, 0.9, "baseline"), "gpus": "0,1", "done": 0})
    view("trial", {**trial(1, 1024, 0.9, "probe"), "index": 2, "gpus": "2,3", "done": 0})
    view("phase", {"phase": "replay", "number": 0})
    view("phase", {"phase": "warm-up", "number": 1})
    view("memory", {**memory([61.0, 60.5], [60.0, 60.0]), "gpus": [0, 1], "number": 0})
    view("memory", {**memory([41.0, 40.5], [40.0, 40.0]), "gpus": [2, 3], "number": 1})
    clock.t += 30
    view("finished", finished(1, "ok", True, 1500.0, 0.8, 0.5))
    console.print(view.render())
    text = console.export_text()
    # One engine run of 20 finished in 30 s; 19 left minus the one running, on 2 groups at once.
    assert "1/20" in text and "ETA 0:04:30" in text
    assert "#0 (baseline)  GPUs 0,1  phase replay" in text
    assert "#1 (probe)" not in text  # finished: a row of the table now
    row = next(line for line in text.splitlines() if line.split() and line.split()[0].lstrip("*") == "1")
    assert "2,3" in row and "1500" in row
    assert "GPU 0" in text and "GPU 2" not in text  # only the gauges of the trial still in flight
