"""The files that run the daemon itself: the systemd unit passes `systemd-analyze verify` with no
warning, and the compose file (read by `docker-compose config`, no engine needed) puts the daemon next
to production with the tuned config directory shared and the deploy section's names matching."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.init import DAEMON_FILE

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "docker" / "autotuner-daemon.service"
COMPOSE = ROOT / "docker" / "compose.daemon.yaml"


def test_the_daemon_unit_verifies() -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    settings = dict(line.split("=", 1) for line in UNIT.read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    # The file `autotuner init --out /etc/autotuner` writes.
    assert settings["ExecStart"].endswith(f"autotuner daemon run /etc/autotuner/{DAEMON_FILE}")
    # The daemon's endpoint and the engines' sockets need more descriptors than the default 1024.
    assert int(settings["LimitNOFILE"]) >= 65536
    # SIGTERM to the daemon alone, so it can roll back before anything else is killed.
    assert settings["KillMode"] == "mixed" and settings["Restart"] == "on-failure"


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed")
    clean = {k: v for k, v in os.environ.items() if k not in ("VLLM_MODEL", "DOCKER_GID")}
    return subprocess.run(["docker-compose", "-p", "autotuner", "-f", str(COMPOSE), "config"], capture_output=True,
                          text=True, timeout=120, env={**clean, **env}, cwd=ROOT)


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only), from either syntax (compose 1.29 prints the short one)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            out[parts[1]] = (parts[0], parts[2:] == ["ro"])
        else:
            out[v["target"]] = (v.get("source", ""), bool(v.get("read_only")))
    return out


def test_the_daemon_beside_production_in_compose() -> None:
    done = _compose_config({"VLLM_MODEL": "meta-llama/Llama-3.1-8B-Instruct", "DOCKER_GID": "998"})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    vllm, daemon = services["vllm"], services["daemon"]
    assert vllm["command"][:3] == ["meta-llama/Llama-3.1-8B-Instruct", "--config", "/etc/vllm/tuned.yaml"]
    assert daemon["command"] == ["daemon", "run", f"/etc/autotuner/{DAEMON_FILE}"]
    # One directory: the daemon writes the tuned file, production reads it.
    assert _mounts(vllm)["/etc/vllm"] == ("/etc/vllm", True)
    assert _mounts(daemon)["/etc/vllm"] == ("/etc/vllm", False)
    # The deploy section the file's header gives (compose_file /compose/compose.daemon.yaml) can be read.
    assert _mounts(daemon)["/compose"] == (str(COMPOSE.parent), True)
    assert "/var/run/docker.sock" in _mounts(daemon)
    assert daemon["stop_signal"] == "SIGTERM" and daemon["init"] is True
    env = dict(item.split("=", 1) if "=" in item else (item, None) for item in daemon["environment"]) \
        if isinstance(daemon["environment"], list) else daemon["environment"]
    assert env["VLLM_MODEL"] == "meta-llama/Llama-3.1-8B-Instruct"  # the compose target re-reads this file
    assert "VLLM_API_KEY=" not in COMPOSE.read_text()  # secrets pass by name, never a value in the file
    assert "VLLM_API_KEY" in env
    assert [str(g) for g in daemon["group_add"]] == ["998"]
    # Production is published on the host's loopback only.
    port = vllm["ports"][0]
    assert port.startswith("127.0.0.1:8000:8000") if isinstance(port, str) else port["host_ip"] == "127.0.0.1"


def test_compose_says_which_variable_is_missing() -> None:
    done = _compose_config({})
    assert done.returncode != 0
    assert "set VLLM_MODEL to the model production serves" in done.stderr
