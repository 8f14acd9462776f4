"""Durations as users write them (`8h`, `90m`, `45s`, `1h30m`, plain seconds): the scenario's budget
timeout and the CLI's --timeout, --soak and --duration all read them the same way."""

from __future__ import annotations

import re

from autotuner.errors import UserInputError


def parse_duration(text: str | None) -> float | None:
    """`8h`, `90m`, `45s`, `1h30m`, or plain seconds."""
    if text is None:
        return None
    total = 0.0
    matched = False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip()):
        matched = True
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
    if not matched or re.sub(r"[\d.\shms]", "", text):
        raise UserInputError(f"duration {text!r}: expected e.g. 8h, 90m, 45s or 1h30m")
    return total
