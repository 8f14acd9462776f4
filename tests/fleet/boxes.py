"""Simulated boxes of a fleet on this machine: each a daemon deployment (tests/support/daemon.py) with its
own $AUTOTUNER_HOME, simulated GPU directory and GPU lock directory, so that its daemon and its production
see only its own GPUs; all of them point at one storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemon import PRODCTL, SCENARIO, TOKEN, Deployment, make_deployment
from tests.support.waiting import wait_for

# The group's settings, sized for tests: a short lease (renewed from a thread every 2 s), a short canary period.
FLEET = {"lease_s": 6, "canary_healthy_s": 4, "soak_s": 2}
TUNE = {"trials": 4, "timeout": "5m", "confirm": "1x2", "soak": "5s"}


@dataclass
class Box(Deployment):
    env: dict[str, str] = field(default_factory=dict)

    def prodctl(self, command: str) -> int:
        return subprocess.run([sys.executable, str(PRODCTL), command, str(self.root)], timeout=120,
                              env=self.env).returncode

    def start_daemon(self) -> subprocess.Popen[bytes]:
        log = self.root / f"daemon-{len(self.daemon_logs)}.log"
        self.daemon_logs.append(log)
        with open(log, "wb") as out:
            self.daemon = subprocess.Popen([sys.executable, "-m", "autotuner", "daemon", "run",
                                            str(self.root / "daemon.yaml")], stdout=out, stderr=subprocess.STDOUT,
                                           env=self.env, start_new_session=True)
        wait_for(self._healthy, 60, "the daemon's /healthz")
        return self.daemon


def make_box(root: Path, name: str, storage: str, gpu: str = "rtx-4090", break_args: list[str] | None = None) -> Box:
    """A box named `name` on simulated `gpu`s; with `break_args`, any config but its first starts with them
    (a box whose hardware answers differently: the group's winner fails its verify there)."""
    scenario: dict[str, Any] = json.loads(json.dumps(SCENARIO))
    scenario["engine"]["sim"]["gpu"] = gpu
    daemon = {"storage": storage, "fleet": {"box": name, **FLEET}, "tune": TUNE, "min_interval_s": 3600,
              "triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "1s"}}}
    d = make_deployment(root, scenario=scenario, daemon=daemon, start=False,
                        sim_args=["--sim-gpu", gpu, "--sim-speedup", "50", "--sim-noise", "0"])
    env = {**os.environ, "AUTOTUNER_DAEMON_TOKEN": TOKEN}
    for var, sub in (("AUTOTUNER_HOME", "home"), ("AUTOTUNER_SIM_STATE_DIR", "sim-gpus"),
                     ("AUTOTUNER_GPU_LOCK_DIR", "gpu-locks")):
        (root / sub).mkdir()
        env[var] = str(root / sub)
    box = Box(d.root, d.port, d.daemon_port, env=env)
    if break_args is not None:
        (root / "trusted.yaml").write_bytes(box.config_file.read_bytes())
        (root / "break_args.json").write_text(json.dumps(break_args))
    box.start_production()
    return box
