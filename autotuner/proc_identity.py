"""Which process a recorded PID means: a PID names a process only together with its start time.

psutil's ``create_time`` is boot time + start ticks; the boot time it derives shifts slightly when the
wall clock is stepped, so a writer's and a reader's value for the same process may differ a little.
One tolerance, used wherever a recorded (pid, create time) is matched: the engine registry and the
simulator's GPU holders.

Create times are on their own clock: the boot time is whole seconds, so a create time may lag
`time.time()` by up to a second (0.86 s on the box that found it). "Started since" is asked with
`clock()`, never with the wall clock.
"""

from __future__ import annotations

import time

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


def clock() -> float:
    """Now, on the clock create times are on (boot time + time since boot)."""
    return psutil.boot_time() + time.clock_gettime(time.CLOCK_BOOTTIME)


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def listening_tree(port: int, uid: int | None = None) -> list[psutil.Process]:
    """The process listening on TCP `port` (of user `uid`, when given) and all its descendants: a server and
    the workers it spawned. Empty when none is found or the socket table may not be read."""
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid is not None:
                proc = psutil.Process(conn.pid)
                if uid is None or proc.uids().real == uid:
                    return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        pass
    return []
