"""structlog, configured once by the CLI: console lines on a terminal, one JSON object per event
otherwise (for journald, files, CI)."""

from __future__ import annotations

import logging
import sys

import structlog


class _Stderr:
    """sys.stderr looked up at each write, so that a live terminal view that swaps it in keeps log
    lines above its panel instead of under it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
