"""The circuit breaker of the study loop: a run whose failures are the machine's, not the candidates',
stops after a few of them with the last fault's reason, instead of recording a FAIL per second until
the time budget ends.

A machine fault is a trial the candidate cannot be blamed for: an infrastructure result (port taken,
memory monitor lost, an internal error), or an engine that failed for a reason no flag causes — a
missing command or model, a broken CUDA driver. A candidate's own failures (OOM, invalid flags, a
startup that ran out of memory) reset the count and never trip it.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Engine output that no flag value causes: the setup is broken.
MACHINE_FAULT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"(?i)cuda driver",
    r"Found no NVIDIA driver",
    r"NVIDIA driver on your system is too old",
    r"no CUDA-capable device is detected",
    r"CUDA initialization: .*",
    r"cudaGetDeviceCount\(\)",
    r"No such file or directory",
    r"is not a local folder and is not a valid model identifier",
    r"Repository Not Found",
    r"ModuleNotFoundError: .*",
    r"Permission denied",
    r"command not found",
))  # fmt: skip
# vLLM's line prefix: `(EngineCore pid=42) ERROR 11-30 12:00:00 [core.py:1] `.
_NOISE = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) [\d-]+ [\d:]+ \[[^\]]+\] )?")


def machine_fault_reason(reason: str | None, log_tail: Iterable[str] = ()) -> str | None:
    """The first line of the reason or the engine's log that names a fault of the machine, or None."""
    for line in [reason or "", *log_tail]:
        for pattern in MACHINE_FAULT_PATTERNS:
            if pattern.search(line):
                return _NOISE.sub("", line.strip())[:300]
    return None


@dataclass
class CircuitBreaker:
    """`in_a_row` machine faults in a row, or `max_share` of the last `window` trials, trip it."""

    in_a_row: int = 3
    window: int = 10
    max_share: float = 0.5
    tripped: str | None = None
    _streak: int = 0
    _recent: collections.deque[bool] = field(default_factory=lambda: collections.deque(maxlen=10))

    def __post_init__(self) -> None:
        self._recent = collections.deque(maxlen=self.window)

    def record(self, machine_fault: bool, reason: str | None = None) -> str | None:
        """Count one finished trial; returns why the run must stop, once it must."""
        self._recent.append(machine_fault)
        self._streak = self._streak + 1 if machine_fault else 0
        if not machine_fault or self.tripped is not None:
            return self.tripped
        faults = sum(self._recent)
        if self._streak >= self.in_a_row:
            self.tripped = f"{self._streak} machine faults in a row, the last: {reason}"
        elif len(self._recent) == self.window and faults / self.window >= self.max_share:
            self.tripped = f"{faults} of the last {self.window} trials were machine faults, the last: {reason}"
        return self.tripped
