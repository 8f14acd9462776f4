"""Log lines in vLLM 0.32's format, so that a log classifier written for vLLM reads the simulator's.

    (APIServer pid=1234) INFO 11-30 08:30:01 [api_server.py:1885] message
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class VllmLog:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.pid = os.getpid()

    def line(self, process: str, level: str, where: str, message: str, pid: int | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        label = f"({process} pid={pid or self.pid}) {level} "
        text = "".join(label + (f"{stamp} [{where}] " if i == 0 else "") + part + "\n"
                       for i, part in enumerate(message.split("\n")))
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # like logging's handlers: a lost log reader must not kill the engine

    def api(self, message: str, where: str = "api_server.py:1885", level: str = "INFO") -> None:
        self.line("APIServer", level, where, message)

    def core(self, message: str, where: str = "core.py:93", level: str = "INFO") -> None:
        self.line("EngineCore", level, where, message)

    def worker(self, rank: int, pid: int, message: str, where: str = "gpu_worker.py:276",
               level: str = "INFO") -> None:
        self.line(f"Worker_TP{rank}", level, where, message, pid=pid)
