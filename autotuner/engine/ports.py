"""Ports on 127.0.0.1 for the engines we start.

By default the kernel picks a free port (bind port 0, read it, close). That leaves a gap between our
close and the engine's bind in which another process on the machine can take the port: a second tuner,
a test worker beside this one, or any outgoing connection, whose local port comes from the same
ephemeral range. `AUTOTUNER_PORT_RANGE=LOW-HIGH` gives this process (and what it starts) a range of its
own; keep it below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`) and apart
from other tuners' ranges, and no one else is handed those ports. Either way one process never hands
out the same port twice in a row of `_REMEMBERED` ports, so trials started side by side never collide.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from collections import deque

from autotuner.errors import InfrastructureError, UserInputError

PORT_RANGE_ENV = "AUTOTUNER_PORT_RANGE"
_REMEMBERED = 512
_ATTEMPTS = 256

_lock = threading.Lock()
_handed_out: deque[int] = deque(maxlen=_REMEMBERED)
_rng = random.Random(os.urandom(16))


def port_range(spec: str | None = None) -> tuple[int, int] | None:
    """The range `AUTOTUNER_PORT_RANGE` names (LOW-HIGH, inclusive), or None when it is unset."""
    spec = os.environ.get(PORT_RANGE_ENV) if spec is None else spec
    if not spec:
        return None
    low, sep, high = spec.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not sep or not 1024 <= lo <= hi <= 65535:
        raise UserInputError(f"{PORT_RANGE_ENV}={spec!r}: expected LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, "
                             "e.g. 20000-20999")
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing has bound and that this process has not handed out lately."""
    bounds = port_range()
    with _lock:
        for _ in range(_ATTEMPTS):
            port = _rng.randint(*bounds) if bounds else 0
            if port and port in _handed_out:
                continue
            got = _try_bind(host, port)
            if got is not None and got not in _handed_out:
                _handed_out.append(got)
                return got
    where = f"in {PORT_RANGE_ENV} {bounds[0]}-{bounds[1]}" if bounds else "from the kernel"
    raise InfrastructureError(f"no free port on {host} {where} after {_ATTEMPTS} tries; widen the range or "
                              "stop what holds the ports")


def _try_bind(host: str, port: int) -> int | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return None
        return int(s.getsockname()[1])
