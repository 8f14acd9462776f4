"""The compose files: each one validates, and the simulated box comes up healthy and answers on the
published 127.0.0.1 port."""

from __future__ import annotations

import shutil
import uuid
from typing import Any

import httpx
import pytest
import yaml

from autotuner.engine.ports import free_port
from tests.support.docker import ROOT, Docker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900, func_only=True)]

COMPOSE_FILES = sorted((ROOT / "docker").glob("compose*.yaml"))


@pytest.fixture(scope="module")
def compose(docker: Docker) -> Docker:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (tools/docker_env.sh installs it when it starts the engine)")
    return docker


def test_there_are_compose_files() -> None:
    assert {p.name for p in COMPOSE_FILES} >= {"compose.sim.yaml", "compose.tune.yaml"}


# Variables a file requires (no sensible default: the model production serves, the docker group).
REQUIRED_ENV = {"compose.daemon.yaml": {"VLLM_MODEL": "facebook/opt-125m", "DOCKER_GID": "999"}}


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_validates(compose: Docker, path: Any) -> None:
    done = compose.compose("-f", str(path), "config", env=REQUIRED_ENV.get(path.name))
    assert "services:" in done.stdout


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source, from either syntax (compose 1.29 prints the short one, v2 the long one)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v.get("source", ""), v["target"]
        out[target] = source
    return out


def test_tune_job_keeps_the_study_on_a_volume_and_stops_gracefully(compose: Docker) -> None:
    done = compose.compose("-f", "docker/compose.tune.yaml", "config", env={"AUTOTUNER_SCENARIO": "quickstart.yaml"})
    config = yaml.safe_load(done.stdout)
    tune = config["services"]["tune"]
    assert tune["command"][:2] == ["tune", "/scenarios/quickstart.yaml"]
    assert "/data/autotuner.db" in tune["command"]
    mounts = _mounts(tune)
    assert mounts["/data"] == "autotuner-data" and "autotuner-data" in config["volumes"]
    assert mounts["/scenarios"] == str(ROOT / "scenarios")
    assert tune["init"] is True and tune["ipc"] == "host" and tune["stop_signal"] == "SIGTERM"
    assert tune["stop_grace_period"] in ("60s", "1m0s")
    assert "ports" not in tune  # vLLM listens on the container's loopback only


def test_simulated_box_comes_up_healthy(compose: Docker, sim_image: str) -> None:
    port = free_port()
    project = f"autotuner-test-{uuid.uuid4().hex[:8]}"
    env = {"AUTOTUNER_IMAGE": sim_image, "AUTOTUNER_SIM_PORT": str(port)}
    args = ["-p", project, "-f", "docker/compose.sim.yaml"]
    compose.compose(*args, "up", "-d", "--no-build", env=env, timeout=600)
    try:
        container = compose.compose(*args, "ps", "-q", "sim", env=env).stdout.strip()
        assert container

        def healthy() -> bool:
            status = compose.inspect(container, "{{.State.Health.Status}}")
            assert status in ("starting", "healthy"), compose.run("logs", container).stdout[-3000:]
            return status == "healthy"

        wait_for(healthy, 120, "the compose service's healthcheck passing", interval=1)
        ports = compose.inspect(container, "{{json .NetworkSettings.Ports}}")
        assert f'"HostIp":"127.0.0.1","HostPort":"{port}"' in ports
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10, trust_env=False).json()
        assert [m["id"] for m in models["data"]] == ["llama-2-13b"]
    finally:
        compose.compose(*args, "down", "-v", "-t", "15", env=env, timeout=120, check=False)
