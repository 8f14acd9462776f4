"""A private Docker engine (tools/docker_env.sh) and the simulator image, for the container tests.

The engine, the debootstrap base and Docker's layer cache live under ~/.cache/autotuner, so only the
first run on a machine pays for debootstrap and for the tuner's dependencies from PyPI. Where Docker
cannot run (not root and no engine, no apt-get, a kernel that refuses dockerd) every test here is
skipped with the script's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent.parent
ENV_SCRIPT = ROOT / "tools" / "docker_env.sh"
IMAGE = "autotuner:test-sim"
TUNER_UID = 10001


@dataclass(frozen=True)
class Docker:
    cli: str
    env: dict[str, str]
    base: str

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def compose(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker-compose", *args], env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def inspect(self, what: str, fmt: str) -> str:
        return self.run("inspect", "-f", fmt, what).stdout.strip()

    def volume_path(self, name: str) -> Path:
        """The volume's directory on this host (the engine is local; the tests run as root)."""
        return Path(json.loads(self.run("volume", "inspect", name).stdout)[0]["Mountpoint"])


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    out = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if out.returncode == 3:
        reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "docker_env.sh: no reason given"
        pytest.skip(reason)
    if out.returncode != 0:
        raise AssertionError(f"tools/docker_env.sh failed ({out.returncode}):\n{out.stderr[-4000:]}")
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    env = {**os.environ, "DOCKER_HOST": values["DOCKER_HOST"], "DOCKER_BUILDKIT": "0"}
    try:
        yield Docker(values["AUTOTUNER_DOCKER"], env, values["AUTOTUNER_DOCKER_BASE"])
    finally:
        if values.get("AUTOTUNER_DOCKERD_STARTED") == "1":
            subprocess.run(["bash", str(ENV_SCRIPT), "stop"], timeout=120, check=False)


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


def wait_for(predicate: object, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError(f"{what} not seen in {timeout:.0f} s")
