"""The daemon end to end, as its tests and benchmarks/daemon_cycle.py drive it: the simulator plays
production behind a `command` deploy target (tests/daemon/prodctl.py), the daemon runs as its own process
(`python -m autotuner daemon run`), and a `Deployment` reads what it did from GET /status and the database.
Here: the scenario production is tuned for (SCENARIO), the config it runs before the daemon touches it
(INITIAL), and `make_deployment` / `tear_down`, which the `deployment` fixture of tests/daemon/conftest.py
and the benchmark share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from autotuner.engine.ports import free_port
from tests.support.waiting import wait_for

PRODCTL = Path(__file__).resolve().parents[1] / "daemon" / "prodctl.py"
TOKEN = "test-token-0123456789"
# Llama-2-7B on one simulated RTX 4090: a tune trial in virtual time takes ~1 s of CPU here.
SCENARIO: dict[str, Any] = {
    "name": "prod",
    "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "flags": {"max-model-len": 4096},
               "sim": {"gpu": "rtx-4090", "noise": 0.0}, "startup_timeout_s": 60},
    "workload": {"requests": {"count": 16, "prompt_tokens": {"kind": "uniform", "low": 500, "high": 3000},
                              "output_tokens": 32},
                 "arrivals": {"kind": "concurrency", "concurrency": 8}, "warmup_requests": 0},
    "objectives": [{"metric": "output_tokens_per_s", "direction": "maximize"}],
}
# What production runs before the daemon touches it: a cautious hand-written config.
INITIAL = {"max-model-len": 4096, "max-num-batched-tokens": 600, "gpu-memory-utilization": 0.8}
SIM_ARGS = ["--sim-gpu", "rtx-4090", "--sim-speedup", "50", "--sim-noise", "0"]


@dataclass
class Deployment:
    root: Path
    port: int
    daemon_port: int
    daemon: subprocess.Popen[bytes] | None = None
    daemon_logs: list[Path] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.root / "config.yaml"

    def live_config(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.config_file.read_text()))

    def running_config(self) -> dict[str, Any]:
        return dict(yaml.safe_load((self.root / "running.yaml").read_text()))

    def prodctl(self, command: str) -> int:
        return subprocess.run([sys.executable, str(PRODCTL), command, str(self.root)], timeout=120).returncode

    def swap_model(self, model: str) -> None:
        """What a person does: point the service at another model and restart it."""
        (self.root / "model.txt").write_text(model)
        assert self.prodctl("stop") == 0
        self.start_production()

    def start_production(self) -> None:
        assert self.prodctl("start") == 0
        wait_for(self.production_healthy, 60, "production's /health")

    def production_healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.endpoint + "/health", timeout=2, trust_env=False).status_code == 200
        return False

    def start_daemon(self) -> subprocess.Popen[bytes]:
        log = self.root / f"daemon-{len(self.daemon_logs)}.log"
        self.daemon_logs.append(log)
        env = {**os.environ, "AUTOTUNER_DAEMON_TOKEN": TOKEN}
        with open(log, "wb") as out:
            self.daemon = subprocess.Popen([sys.executable, "-m", "autotuner", "daemon", "run",
                                            str(self.root / "daemon.yaml")], stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True)
        wait_for(self._healthy, 60, "the daemon's /healthz")
        return self.daemon

    def _healthy(self) -> bool:
        assert self.daemon is not None
        if self.daemon.poll() is not None:
            raise AssertionError(f"daemon exited {self.daemon.returncode}:\n{self.daemon_log()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{self.daemon_port}/healthz", timeout=2, trust_env=False).is_success
        return False

    def daemon_log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in self.daemon_logs)

    def status(self) -> dict[str, Any]:
        r = httpx.get(f"http://127.0.0.1:{self.daemon_port}/status", timeout=30, trust_env=False,
                      headers={"Authorization": f"Bearer {TOKEN}"})
        r.raise_for_status()
        return dict(r.json())

    def metrics(self) -> str:
        r = httpx.get(f"http://127.0.0.1:{self.daemon_port}/metrics", timeout=10, trust_env=False,
                      headers={"Authorization": f"Bearer {TOKEN}"})
        r.raise_for_status()
        return r.text

    def wait_cycle_done(self, timeout: float = 180) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            assert self.daemon is not None
            if self.daemon.poll() is not None:
                raise AssertionError(f"daemon exited {self.daemon.returncode}:\n{self.daemon_log()}")
            try:
                s = self.status()
            except httpx.TimeoutException:
                return None  # a virtual-time trial holds the daemon's event loop for a while: ask again
            last = s.get("last_cycle")
            return s if last is not None and s["state"] == "idle" else None
        try:
            return dict(wait_for(done, timeout, "a cycle to end", interval=0.5))
        except AssertionError:
            raise AssertionError(f"no cycle ended in {timeout} s; daemon log:\n{self.daemon_log()}") from None

    def stop_daemon(self) -> int:
        assert self.daemon is not None
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
        return self.daemon.wait(timeout=120)

    def production_processes(self) -> list[psutil.Process]:
        """Every live simulator serving this deployment's directory (an orphan included)."""
        out = []
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = p.info["cmdline"] or []
            if p.info["status"] != psutil.STATUS_ZOMBIE and "serve" in cmd and str(self.config_file) in cmd:
                out.append(p)
        return out

    def served_root(self) -> str:
        r = httpx.get(self.endpoint + "/v1/models", timeout=5, trust_env=False)
        return str(r.json()["data"][0]["root"])


def make_deployment(root: Path, *, scenario: dict[str, Any] | None = None, daemon: dict[str, Any] | None = None,
                    initial: dict[str, Any] | None = None, model: str = "llama-2-7b",
                    sim_args: list[str] | None = None, start: bool = True) -> Deployment:
    """Production's directory, scenario and daemon config under `root`; production started unless told."""
    root.mkdir(parents=True)
    d = Deployment(root, free_port(), free_port())
    (root / "model.txt").write_text(model)
    (root / "port").write_text(str(d.port))
    (root / "args.json").write_text(json.dumps(SIM_ARGS if sim_args is None else sim_args))
    (root / "config.yaml").write_text(yaml.safe_dump(INITIAL if initial is None else initial))
    (root / "scenario.yaml").write_text(yaml.safe_dump(scenario or SCENARIO))
    ctl = [sys.executable, str(PRODCTL)]
    config = {
        "scenario": "scenario.yaml",
        "storage": "autotuner.db",
        "production": {"endpoint": d.endpoint, "log": str(root / "vllm.log")},
        "deploy": {"kind": "command", "config_path": str(root / "config.yaml"),
                   "start": [*ctl, "start", str(root)], "stop": [*ctl, "stop", str(root)],
                   "status": [*ctl, "status", str(root)], "start_grace_s": 30},
        "triggers": {"poll_interval_s": 1, "workload_drift": None},
        "min_interval_s": 0,
        "tune": {"trials": 6, "timeout": "5m", "confirm": "2x2", "soak": "20s"},
        "listen": {"host": "127.0.0.1", "port": d.daemon_port, "token_env": "AUTOTUNER_DAEMON_TOKEN"},
    }
    config.update(daemon or {})
    (root / "daemon.yaml").write_text(yaml.safe_dump(config))
    if start:
        d.start_production()
    return d


def tear_down(d: Deployment) -> None:
    """The daemon's process group, then production (by its pid file, then any orphan of this directory)."""
    if d.daemon is not None and d.daemon.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.daemon.pid, signal.SIGKILL)
        d.daemon.wait(timeout=10)
    d.prodctl("stop")
    for p in d.production_processes():
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def daemon_cli(d: Deployment, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`autotuner daemon ARGS...` as an operator types it, the deployment's daemon.yaml appended to `run`,
    `plan`, `status`, `approve` and `reject` by the caller (the argument order is the CLI's)."""
    env = {**os.environ, "AUTOTUNER_DAEMON_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-m", "autotuner", "daemon", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
