"""How a measured trial looks on a terminal: `autotuner measure`'s outcome, flags and measures table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autotuner.trials.result import TrialResult

GIB = float(1 << 30)


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_trial(result: TrialResult, console: Console | None = None) -> None:
    console = console or Console()
    style = "green" if result.outcome == "ok" else "red"
    console.print(f"[bold {style}]{result.outcome}[/]" + (f": {result.reason}" if result.reason else ""),
                  highlight=False)
    console.print("flags: " + " ".join(f"{k}={v}" for k, v in result.flags.items()), highlight=False)
    table = Table(show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    m = result.metrics
    if result.time_scale != 1:
        table.caption = f"simulated engine: times in simulated seconds (speed-up {result.time_scale:g})"
    table.add_row("startup (s, wall)", _fmt(result.startup_s, 1))
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s"):
        table.add_row(key, _fmt(m.get(key), 1))
    for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s"):
        table.add_row(key, _fmt(m.get(key)))
    if m:
        table.add_row("completed / failed", f"{m.get('completed')} / {m.get('failed')}")
    peaks = result.memory.get("peak_bytes")
    totals = result.memory.get("total_bytes")
    if isinstance(peaks, list) and isinstance(totals, list) and peaks:
        table.add_row("memory peak per device (GiB)", " ".join(f"{p / GIB:.2f}" for p in peaks))
        table.add_row("memory peak fraction", _fmt(result.memory.get("peak_fraction")))
        table.add_row("samples (Hz)", f"{result.memory.get('samples')} ({_fmt(result.memory.get('sample_hz'), 0)})")
    e = result.engine
    table.add_row("KV cache tokens", _fmt(e.get("kv_cache_tokens")))
    table.add_row("KV cache usage max", _fmt(e.get("kv_cache_usage_max")))
    table.add_row("preemptions", _fmt(e.get("preemptions")))
    table.add_row("engine version", _fmt(e.get("version")))
    console.print(table)
    console.print(f"engine log: {e.get('log_path')}", highlight=False)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
