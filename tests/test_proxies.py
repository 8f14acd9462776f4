"""Proxies: the engines we start on 127.0.0.1 are measured directly whatever the environment says;
`verify` uses the user's proxy settings and, when a request failed through a proxy, says so."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from autotuner.engine.ports import free_port
from autotuner.workload.proxies import proxy_for, through_proxy

ROOT = Path(__file__).parent.parent
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return dict(os.environ)


@pytest.fixture
def bad_gateway() -> Iterator[str]:
    """A proxy that answers every request with 502, as one that cannot reach the endpoint does."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(502)
            self.end_headers()
            self.wfile.write(b"bad gateway")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_proxy_resolution_follows_no_proxy(clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert proxy_for("http://10.0.0.5:8000") is None
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.local:3128")
    assert proxy_for("http://10.0.0.5:8000") == "http://user:pw@proxy.local:3128"
    assert proxy_for("https://10.0.0.5") is None  # only HTTP_PROXY is set
    note = through_proxy("http://10.0.0.5:8000", "answered 502")
    assert note is not None and note.startswith("HTTP_PROXY is set and NO_PROXY does not cover 10.0.0.5: the "
                                                "request went through the proxy http://user:***@proxy.local:3128, "
                                                "which answered 502")
    monkeypatch.setenv("NO_PROXY", "localhost,10.0.0.5")
    assert proxy_for("http://10.0.0.5:8000") is None and through_proxy("http://10.0.0.5:8000", "x") is None


def test_measure_ignores_proxies_for_the_engines_it_starts(clean_env: dict[str, str], tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["workload"]["requests"]["count"] = 4
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump(data))
    dead = f"http://127.0.0.1:{free_port()}"
    env = {**clean_env, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
           "AUTOTUNER_HOME": str(tmp_path / "home"), "AUTOTUNER_SIM_STATE_DIR": str(tmp_path / "gpus")}
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "autotuner", "measure", str(path), "--set",
                           "max-num-batched-tokens=1024", "--set", "gpu-memory-utilization=0.8", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    result = json.loads(out.read_text()) if out.exists() else {}
    assert result.get("outcome") == "ok", (result.get("reason"), done.stderr[-3000:])
    assert done.returncode == 0
    assert result["metrics"]["completed"] == 4 and result["metrics"]["failed"] == 0


def verify(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "verify", "--base-url", url], capture_output=True,
                          text=True, timeout=120, env=env)


def test_verify_through_a_dead_proxy_names_the_proxy(clean_env: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    endpoint = f"http://127.0.0.1:{free_port()}"
    done = verify(endpoint, {**clean_env, "HTTP_PROXY": dead})
    assert done.returncode == 1
    assert (f"HTTP_PROXY is set and NO_PROXY does not cover 127.0.0.1: the request went through the proxy {dead}, "
            "which could not be reached") in done.stderr
    # Without the proxy the same failure is the endpoint's own.
    done = verify(endpoint, {**clean_env, "HTTP_PROXY": dead, "NO_PROXY": "127.0.0.1"})
    assert done.returncode == 1 and "connection refused" in done.stderr and "proxy" not in done.stderr


def test_verify_says_the_proxy_answered_502(clean_env: dict[str, str], bad_gateway: str) -> None:
    done = verify("http://10.0.0.5:8000", {**clean_env, "ALL_PROXY": bad_gateway})
    assert done.returncode == 1
    assert (f"ALL_PROXY is set and NO_PROXY does not cover 10.0.0.5: the request went through the proxy "
            f"{bad_gateway}, which answered 502") in done.stderr
