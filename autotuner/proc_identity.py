"""Which process a recorded PID means: a PID names a process only together with its start time.

psutil's ``create_time`` is boot time + start ticks; the boot time it derives shifts slightly when the
wall clock is stepped, so a writer's and a reader's value for the same process may differ a little.
One tolerance, used wherever a recorded (pid, create time) is matched: the engine registry and the
simulator's GPU holders.
"""

from __future__ import annotations

import psutil

CREATE_TIME_TOLERANCE_S = 0.5


def same_start(a: float, b: float) -> bool:
    return abs(a - b) <= CREATE_TIME_TOLERANCE_S


def live_process(pid: int, create_time: float) -> psutil.Process | None:
    """The process with this PID if it is the one started at ``create_time`` and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if not same_start(proc.create_time(), create_time) or proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
