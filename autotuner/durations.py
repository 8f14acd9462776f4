"""Durations as users write them (`8h`, `90m`, `45s`, `1h30m`, plain seconds): the scenario's budget
timeout and the CLI's --timeout, --soak and --duration all read them the same way."""

from __future__ import annotations

import math
import re

from autotuner.errors import UserInputError, quoted


def parse_duration(text: str | None) -> float | None:
    """`8h`, `90m`, `45s`, `1h30m`, or plain seconds."""
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > 100:
        raise UserInputError(f"duration {quoted(text, 60)}: expected e.g. 8h, 90m, 45s or 1h30m")
    total = 0.0
    matched = False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip()):
        matched = True
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
    if not matched or re.sub(r"[\d.\shms]", "", text):
        raise UserInputError(f"duration {quoted(text, 60)}: expected e.g. 8h, 90m, 45s or 1h30m")
    return bounded(total, text)


# A year: beyond it a duration is a typo (or 400 digits, which float() reads as infinity).
MAX_DURATION_S = 366 * 86400.0


def bounded(seconds: float, text: object) -> float:
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise UserInputError(f"duration {quoted(text, 60)}: at most 366 days")
    return seconds
