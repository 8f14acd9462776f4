"""The Docker side of the container tests: the repository root the images are built from and compose runs
in, the uid the tuner image runs as (TUNER_UID), and `Docker`, the CLI and docker-compose bound to the private
engine of tests/docker/conftest.py (whose `docker` fixture hands one out). The test modules use the class in
their annotations and the constants in their checks, so they live here rather than in the conftest."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
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
