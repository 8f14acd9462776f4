"""`autotuner verify` against the simulator as a real server: a healthy endpoint, and each way an
endpoint can be wrong, told in words a user can act on."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from autotuner.engine.ports import free_port

SIM = ["llama-2-13b", "-tp", "8", "--max-model-len", "8192", "--sim-speedup", "50",
       "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "1024"]


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "verify", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def prefix_cache(url: str) -> tuple[float, float]:
    """The server's prefix cache counters: tokens queried, tokens found cached."""
    found = {f.name: sum(s.value for s in f.samples if s.name.endswith("_total"))
             for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)}
    return found["vllm:prefix_cache_queries"], found["vllm:prefix_cache_hits"]


def test_healthy_endpoint_passes(sim_server) -> None:
    server = sim_server.start([*SIM, "--served-model-name", "m13"])
    done = verify("--base-url", server.url)
    assert done.returncode == 0, done.stderr
    assert "model m13: 8 ok, 0 failed" in done.stdout
    assert "TTFT p50" in done.stdout
    # Verify again: its prompts are its own, so the server prefills them (the same prompts found every
    # KV block cached — a check of concurrent long prefills that prefilled nothing).
    queried, hits = prefix_cache(server.url)
    assert queried > 0
    assert verify("--base-url", server.url).returncode == 0
    more_queried, more_hits = prefix_cache(server.url)
    assert more_queried - queried > 8 * 2000
    assert (more_hits - hits) / (more_queried - queried) < 0.05, (more_hits - hits, more_queried - queried)


def test_unreachable_upstream(sim_state) -> None:
    done = verify("--base-url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "connection refused" in done.stderr and "Is the server running" in done.stderr
    assert "Inside a container, 127.0.0.1 is the container itself" in done.stderr


def test_missing_and_wrong_api_key(sim_server) -> None:
    server = sim_server.start([*SIM, "--api-key", "right-key"])
    done = verify("--base-url", server.url, "--api-key-env", "MY_KEY", env={"MY_KEY": ""})
    assert done.returncode == 1
    assert "401 Unauthorized" in done.stderr and "$MY_KEY is not set" in done.stderr
    done = verify("--base-url", server.url, "--api-key-env", "MY_KEY", env={"MY_KEY": "wrong"})
    assert done.returncode == 1 and "rejected the API key from $MY_KEY" in done.stderr
    assert "right-key" not in done.stdout + done.stderr and "wrong" not in done.stdout + done.stderr
    done = verify("--base-url", server.url + "/v1", "--api-key-env", "MY_KEY", env={"MY_KEY": "right-key"})
    assert done.returncode == 0, done.stderr


def test_wrong_model_name_lists_served_names(sim_server) -> None:
    server = sim_server.start([*SIM, "--served-model-name", "alpha", "beta"])
    done = verify("--base-url", server.url, "--model", "gamma")
    assert done.returncode == 1
    assert "does not serve a model named 'gamma'; it serves alpha, beta" in done.stderr


def test_bad_url_is_bad_input() -> None:
    done = verify("--base-url", "localhost:8000")
    assert done.returncode == 2
    assert "expected http(s)://HOST[:PORT]" in done.stderr


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A misconfigured gateway: lists the model, then answers completions in another API's format."""

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path.startswith("/tokenize"):
            self.send_response(404)
            self.end_headers()
            return
        data = b'data: {"output": "hello"}\n\ndata: [DONE]\n\n'
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_responses_without_choices_are_explained() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        done = verify("--base-url", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert done.returncode == 1
    assert "without `choices`" in done.stderr
    assert "does not speak the OpenAI completions format" in done.stderr


def test_prompts_are_fitted_to_the_served_context(sim_server) -> None:
    """The default check's prompts (3000–6000 tokens) would not fit a 4096-token context: verify reads
    max_model_len from /v1/models, shortens them, says so, and the endpoint is not called broken."""
    server = sim_server.start(["llama-2-13b", "-tp", "8", "--max-model-len", "4096", "--sim-speedup", "50",
                               "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "1024"])
    done = verify("--base-url", server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model llama-2-13b: 8 ok, 0 failed" in done.stdout
    assert "the server's context is 4096 tokens" in done.stdout
    assert "prompts fitted to at most 4016 tokens" in done.stdout
