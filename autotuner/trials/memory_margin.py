"""How far a trial's memory peak went past the OOM threshold, for the constraints and for export.

One threshold object (`Threshold`, built by `scoring.threshold_of`) decides everywhere: a fraction of each
card, or a number of MiB that must stay free on each card.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotuner.monitor import Threshold

MIB = 2**20


def excess(memory: Mapping[str, Any], threshold: Threshold) -> float:
    """max over devices of (peak − limit) / total: > 0 past the threshold, ≤ 0 under it."""
    peaks = list(memory.get("peak_bytes") or [])
    totals = list(memory.get("total_bytes") or [])
    pairs = [(float(p), int(t)) for p, t in zip(peaks, totals, strict=False) if t]
    if pairs:
        return max((p - threshold.limit_bytes(t)) / t for p, t in pairs)
    # No per-device bytes (an old row): only a fraction threshold can be judged from the peak fraction.
    peak = float(memory.get("peak_fraction") or 0.0)
    return peak - (threshold.fraction if threshold.fraction is not None else 1.0)


def crash_excess(memory: Mapping[str, Any], threshold: Threshold) -> float:
    """A CUDA OOM crash filled a card: the excess of a peak at the card's total, and a bit more."""
    totals = [int(t) for t in memory.get("total_bytes") or [] if t]
    if totals:
        return max((t - threshold.limit_bytes(t)) / t for t in totals) + 0.01
    return 1.0 - (threshold.fraction if threshold.fraction is not None else 1.0) + 0.01


def describe(threshold: Threshold) -> str:
    if threshold.fraction is not None:
        return f"{threshold.fraction:.0%} of each GPU's memory"
    return f"{threshold.min_free_mib:g} MiB left free on each GPU"
