"""`init --from-endpoint`: everything an endpoint says is data. A `/v1/models` answer whose `root` and id
hold line breaks and YAML look-alikes must not add a key to scenario.yaml or the daemon config: the
files written hold exactly the keys init meant (or init refuses, one error line, nothing written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = ("/models/tiny\nstorage: sqlite:////tmp/evil.db\nbudget:\n  trials: 1\n# \u2028listen: {host: 0.0.0.0}"
        "\r\nevil: true")
SERVED = "prod\nscenario: /etc/evil.yaml\n"

# A vLLM-shaped endpoint that answers with hostile strings: a process of its own, over real HTTP.
SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
models = json.loads(sys.argv[1])
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/v1/models": json.dumps(models), "/version": json.dumps({"version": "0.6.3\\nevil: 1"}),
                "/metrics": ""}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

SCENARIO_KEYS = {"name", "storage", "engine", "workload", "search_space", "current_config"}
DAEMON_KEYS = {"scenario", "production", "deploy", "approve", "window", "max_downtime", "triggers",
               "min_interval_s", "tune", "listen"}


@pytest.fixture
def hostile_endpoint() -> Iterator[str]:
    models = {"object": "list", "data": [{"id": SERVED, "object": "model", "root": ROOT, "max_model_len": 4096}]}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(models)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{proc.stdout.readline().strip()}"
    finally:
        proc.kill()
        proc.wait()


def init(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "init", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "AUTOTUNER_MONITOR": "none"})


def check_written(out: Path, done: subprocess.CompletedProcess[str], engine_model: str) -> None:
    if done.returncode == 2:  # refused: one error line, nothing written
        assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr, done.stderr
        assert not out.exists() or list(out.iterdir()) == []
        return
    assert done.returncode == 0, done.stderr
    scenario = yaml.safe_load((out / "scenario.yaml").read_text())
    daemon = yaml.safe_load((out / "autotuner-daemon.yaml").read_text())
    assert set(scenario) <= SCENARIO_KEYS, set(scenario) - SCENARIO_KEYS
    assert set(daemon) <= DAEMON_KEYS, set(daemon) - DAEMON_KEYS
    assert scenario["engine"]["model"] == engine_model  # the endpoint's string, as data
    assert "evil" not in json.dumps(daemon)
    for text in ((out / "scenario.yaml").read_text(), (out / "autotuner-daemon.yaml").read_text()):
        for line in text.split("\n"):
            assert not line.startswith(("evil", "budget", "listen: {")), line


def test_endpoint_strings_stay_data(hostile_endpoint: str, tmp_path: Path) -> None:
    out = tmp_path / "init"
    check_written(out, init("--from-endpoint", hostile_endpoint, "--out", str(out)), ROOT)


def test_endpoint_strings_stay_data_beside_a_command_line(hostile_endpoint: str, tmp_path: Path) -> None:
    # The command line's model differs from the endpoint's root: init writes a note quoting the root.
    out = tmp_path / "init"
    done = init("--from-cmd", "vllm serve /models/other --max-model-len 4096", "--from-endpoint", hostile_endpoint,
                "--out", str(out))
    check_written(out, done, "/models/other")
    if done.returncode == 0:
        text = (out / "scenario.yaml").read_text()
        assert "storage: sqlite:////tmp/evil.db" in text  # the note is there, folded into its comment line
        assert "\nstorage: sqlite:////tmp/evil.db" not in text
