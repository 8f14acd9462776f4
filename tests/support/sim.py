"""The simulator as a real process over real HTTP, for tests: start one, wait until it serves, kill its group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from autotuner.engine.ports import free_port


@dataclass
class SimServer:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def start_sim(args: list[str], log_path: Path, wait_ready: bool = True, timeout: float = 30) -> SimServer:
    port = free_port()
    argv = [sys.executable, "-m", "autotuner.sim", "serve", *args, "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = SimServer(proc, port, log_path)
    if wait_ready:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"simulator exited {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        server.kill_group()
        raise AssertionError(f"simulator not ready in {timeout}s:\n{server.log()}")
    return server
