"""How numbers read in exported files, reports and the status table (one place, so they agree)."""

from __future__ import annotations

GIB = float(1 << 30)


def gib(nbytes: float | int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def seconds(value: float | int | None) -> str:
    """Latencies: milliseconds below one second, where the digits that matter are."""
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"


def rate(value: float | int | None, unit: str = "tok/s") -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def percent(fraction: float | int | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f} %"


def change(new: float | int | None, old: float | int | None) -> str:
    """Relative change from `old` to `new`; '-' where either is missing or `old` is zero."""
    if new is None or old is None or old == 0:
        return "-"
    return f"{(new - old) / abs(old) * 100:+.1f} %"


def flag_value(value: object) -> str:
    """A flag value as a person reads it (and as vLLM's argv gets it): floats without noise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return " ".join(flag_value(v) for v in value)
    return str(value)
