"""What a step leaves: JSON lines appended and flushed as it goes (``Recorder``), so a killed step
keeps what it measured; the parent reads them back (``read_records``) into a ``StepResult``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Recorder:
    """One step's JSON-lines file: `set` a fact, `add` a row to a table; each line flushed as written."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the step's life

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def set(self, key: str, value: Any) -> None:
        self._write({"set": key, "value": value})

    def add(self, table: str, row: dict[str, Any]) -> None:
        self._write({"add": table, "row": row})

    def close(self) -> None:
        self._file.close()


def read_records(path: Path) -> dict[str, Any]:
    """{"facts": {...}, "tables": {name: [rows]}}; a half-written last line (a killed step) is skipped."""
    facts: dict[str, Any] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "set" in record:
                facts[record["set"]] = record["value"]
            elif "add" in record:
                tables.setdefault(record["add"], []).append(record["row"])
    return {"facts": facts, "tables": tables}


@dataclass
class StepResult:
    """One step as the parent saw it: its status, time and box, and the figures its file held."""

    name: str
    status: str  # ok | error | timeout | skipped
    seconds: float
    box_s: float
    facts: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]]
    note: str = ""
