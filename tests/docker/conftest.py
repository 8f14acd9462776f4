"""A private Docker engine (tools/docker_env.sh) and the simulator image, for the container tests.

The engine, the debootstrap base and Docker's layer cache live under ~/.cache/autotuner, so only the
first run on a machine pays for debootstrap and for the tuner's dependencies from PyPI. Where Docker
cannot run (not root and no engine, no apt-get, a kernel that refuses dockerd) every test here is
skipped with the script's reason.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.docker import ROOT, Docker
from tests.support.machine import SharedResource

ENV_SCRIPT = ROOT / "tools" / "docker_env.sh"
IMAGE = "autotuner:test-sim"


def _start_engine() -> dict[str, str]:
    out = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if out.returncode == 3:
        reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "docker_env.sh: no reason given"
        pytest.skip(reason)
    if out.returncode != 0:
        raise AssertionError(f"tools/docker_env.sh failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def _stop_engine(values: dict[str, str]) -> None:
    if values.get("AUTOTUNER_DOCKERD_STARTED") == "1":
        subprocess.run(["bash", str(ENV_SCRIPT), "stop"], timeout=120, check=False)


def _engine_answers(values: dict[str, str]) -> bool:
    env = {**os.environ, "DOCKER_HOST": values["DOCKER_HOST"]}
    done = subprocess.run([values["AUTOTUNER_DOCKER"], "version"], env=env, capture_output=True, timeout=30,
                          check=False)
    return done.returncode == 0


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    """The private engine, once per machine: the first test process that needs it starts it (when no engine
    answers yet), the last one to finish stops it, never one worker under another."""
    with SharedResource("docker-engine").hold(_start_engine, _stop_engine, _engine_answers) as values:
        env = {**os.environ, "DOCKER_HOST": values["DOCKER_HOST"], "DOCKER_BUILDKIT": "0"}
        yield Docker(values["AUTOTUNER_DOCKER"], env, values["AUTOTUNER_DOCKER_BASE"])


@pytest.fixture(scope="session")
def sim_image(docker: Docker) -> str:
    """docker/Dockerfile on the Debian base: the simulator image (layers cached between runs)."""
    docker.run("build", "--network", "host", "-f", "docker/Dockerfile", "--build-arg", f"BASE={docker.base}",
               "-t", IMAGE, str(ROOT), timeout=3600)
    return IMAGE


@pytest.fixture(scope="session")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart scenario made small: a few seconds a trial on the simulated box."""
    folder = tmp_path_factory.mktemp("scenarios")
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["name"] = "docker-quick"
    data["workload"]["requests"].update(count=8, prompt_tokens={"kind": "uniform", "low": 2000, "high": 4000},
                                        output_tokens=64)
    data["workload"]["warmup_requests"] = 0
    # Latency SLOs measured by a client on a loaded 2-core machine say nothing here; export needs a
    # feasible winner, not a fast one.
    data.pop("slos", None)
    (folder / "quick.yaml").write_text(yaml.safe_dump(data))
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)
    return folder


@pytest.fixture
def volume(docker: Docker) -> Iterator[str]:
    name = f"autotuner-test-{uuid.uuid4().hex[:10]}"
    docker.run("volume", "create", name)
    yield name
    docker.run("volume", "rm", "-f", name, check=False)
