"""structlog, configured once by the CLI, with two outputs:

- the full log, every event as one JSON object per line, in a file (`$AUTOTUNER_HOME/logs/<name>.jsonl`,
  attached once the study's name is known: events before that are kept and written first);
- the console (stderr): on a terminal only warnings and errors, one short line each, so that the live
  view stays readable; piped or with `--log-format json`, every event as JSON lines (for journald, CI);
  with `--quiet`, nothing.

Secrets are masked in every output (`redact_secrets` runs before anything is rendered).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog

from autotuner.private_files import append_text
from autotuner.secrets import redact, redact_value

LogFormat = Literal["auto", "console", "json"]
_EARLY_EVENTS = 2000  # kept in memory until the file is attached; a preflight logs a handful
_CONSOLE_WIDTH = 200
_LOUD = {"warning", "error", "critical", "exception"}  # one console line at most; the full event is in the file


class _Stderr:
    """sys.stderr looked up at each write, so that a live terminal view that swaps it in keeps log
    lines above its panel instead of under it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def redact_secrets(_logger: object, _method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """The safety net under every log line: known secret values and URL passwords become ***, in
    every value, however deeply nested."""
    return {key: value if key == "exc_info" else _redacted(value) for key, value in event.items()}


def _redacted(value: Any) -> Any:
    # Values, not the rendered JSON line: a secret json.dumps escapes would slip past a text mask.
    if isinstance(value, BaseException | Path):
        return redact(str(value))
    if isinstance(value, dict):
        return {redact_value(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    return redact_value(value)


def console_line(event: structlog.typing.EventDict) -> str:
    """`warning: trial.infrastructure_retry reason=…`: the first line of each text, no dicts or lists
    (flag sets and timelines belong in the file)."""
    level = str(event.get("level", "info"))
    parts = [f"{level}: {_first_line(event.get('event', ''))}"]
    for key, value in event.items():
        if key in ("event", "level", "timestamp") or isinstance(value, dict | list | tuple) or value is None:
            continue
        parts.append(f"{key}={_first_line(value)}")
    line = " ".join(parts)
    width = min(_CONSOLE_WIDTH, shutil.get_terminal_size((_CONSOLE_WIDTH, 24)).columns)  # one screen line
    return line if len(line) <= width else line[: width - 1] + "…"


def _first_line(value: object) -> str:
    lines = str(value).strip().splitlines()
    return lines[0] if lines else ""


class LogSinks:
    """Where rendered events go: the structlog logger of every module writes here."""

    def __init__(self, console: Literal["short", "json", "none"]) -> None:
        self.console = console
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._early: list[str] | None = []
        self._lock = threading.Lock()  # the memory sampler thread logs too

    def attach(self, path: Path) -> None:
        """Start writing the full log to `path` (appended: a resumed study keeps one file)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
            self.path = path
            self._file = append_text(path)  # 0600 in a 0700 directory: every event of the run
            for line in self._early or []:
                self._file.write(line + "\n")
            self._early = None
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def write(self, event: structlog.typing.EventDict) -> None:
        line = json.dumps(event, default=str)
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
            elif self._early is not None and len(self._early) < _EARLY_EVENTS:
                self._early.append(line)
        if self.console == "json":
            _Stderr().write(line + "\n")
        elif self.console == "short" and event.get("level") in _LOUD:
            _Stderr().write(console_line(event) + "\n")


_sinks: LogSinks | None = None


def _route(_logger: object, _method: str, event: structlog.typing.EventDict) -> str:
    if _sinks is not None:
        _sinks.write(event)
    raise structlog.DropEvent


def console_mode(log_format: LogFormat = "auto", quiet: bool = False) -> Literal["short", "json", "none"]:
    if quiet:
        return "none"
    if log_format == "json" or (log_format == "auto" and not sys.stderr.isatty()):
        return "json"
    return "short"


def configure(verbose: bool = False, log_format: LogFormat = "auto", quiet: bool = False) -> LogSinks:
    """Once per process (the CLI's commands call it first); `attach_file` adds the file later."""
    global _sinks
    if _sinks is not None:
        _sinks.close()
    _sinks = LogSinks(console_mode(log_format, quiet))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Tracebacks as text before the mask, so that a secret inside an exception is masked too.
            structlog.processors.format_exc_info,
            redact_secrets,
            _route,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG if verbose else logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    return _sinks


def attach_file(path: Path) -> Path | None:
    """The full log from now on (and the events so far) in `path`; None when logging is not configured."""
    if _sinks is None:
        return None
    _sinks.attach(path)
    return path


def log_file_for(home: Path, name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "autotuner"
    return home / "logs" / f"{safe}.jsonl"
