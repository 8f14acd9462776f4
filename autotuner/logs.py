"""structlog, configured once by the CLI: console lines on a terminal, one JSON object per event
otherwise (for journald, files, CI)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import structlog

from autotuner.secrets import redact


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
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    if isinstance(value, BaseException | Path):
        return redact(str(value))
    return value


def configure(verbose: bool = False, json_lines: bool | None = None) -> None:
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    level = logging.DEBUG if verbose else logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Tracebacks as text before the mask, so that a secret inside an exception is masked too
            # (the console renderer formats its own, from the exception object).
            *([structlog.processors.format_exc_info] if json_lines else []),
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
