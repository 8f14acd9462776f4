"""The simulated production service of the daemon tests, driven like a service manager: `start DIR`,
`stop DIR`, `status DIR` (exit 0 = up). A `command` deploy target calls it with argv lists.

`start` returns once the process is spawned, as `systemctl start` of a simple service does. DIR holds:
model.txt (the model the service runs: a person swaps it there), port, config.yaml (the deployed
`--config`), args.json (more simulator arguments, optional), start_delay (seconds, optional: a slow start),
and, optional, trusted.yaml + break_args.json: any other config (by its flags) starts with those arguments (a production
box that differs from the tuning one, so that a new candidate fails there). The service logs to vllm.log; at
start, running.yaml receives the config it was started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml


def _pid(d: Path) -> int | None:
    try:
        pid = int((d / "pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        proc = psutil.Process(pid)
        return pid if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None


def start(d: Path) -> int:
    if _pid(d) is not None:
        return 0
    delay = float((d / "start_delay").read_text()) if (d / "start_delay").is_file() else 0.0
    time.sleep(delay)
    config = d / "config.yaml"
    args = json.loads((d / "args.json").read_text()) if (d / "args.json").is_file() else []
    trusted = d / "trusted.yaml"
    # The flags, not the bytes: a config rewritten with another header is the same config.
    if trusted.is_file() and yaml.safe_load(config.read_text()) != yaml.safe_load(trusted.read_text()):
        args += json.loads((d / "break_args.json").read_text())
    port = int((d / "port").read_text())
    model = (d / "model.txt").read_text().strip()
    argv = [sys.executable, "-m", "autotuner.sim", "serve", model, "--config", str(config), "--port", str(port),
            *args]
    shutil.copyfile(config, d / "running.yaml")
    with open(d / "vllm.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (d / "pid").write_text(str(proc.pid))
    return 0  # like systemd's Type=simple: started, not yet ready (the daemon waits for /health)


def stop(d: Path) -> int:
    pid = _pid(d)
    if pid is None:
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _pid(d) is not None:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return 0


def status(d: Path) -> int:
    return 0 if _pid(d) is not None else 1


if __name__ == "__main__":
    command, directory = sys.argv[1], Path(sys.argv[2])
    sys.exit({"start": start, "stop": stop, "status": status}[command](directory))
