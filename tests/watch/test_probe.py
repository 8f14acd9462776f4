"""probe() against a real simulator process over HTTP: what it reads, an API key, a dead endpoint."""

from __future__ import annotations

import asyncio

import httpx

from autotuner.engine.ports import free_port
from autotuner.watch import gpu_inventory, model_fingerprint, probe

SIM = ["llama-2-13b", "-tp", "2", "--max-model-len", "4096", "--sim-speedup", "50",
       "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "1024"]


def test_probe_reads_models_version_and_length_histograms(sim_server) -> None:
    server = sim_server.start([*SIM, "--served-model-name", "prod"])
    prompts = [100, 300, 300, 1500]
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
        for n in prompts:
            r = http.post("/v1/completions", json={"model": "prod", "prompt": [7] * n, "max_tokens": 8,
                                                   "ignore_eos": True})
            assert r.status_code == 200, r.text
    snap = asyncio.run(probe(server.url))
    assert snap.reachable, snap.error
    assert snap.error is None
    assert snap.served_model == "prod"
    assert snap.root == "llama-2-13b"
    assert snap.max_model_len == 4096
    assert snap.vllm_version and snap.vllm_version.startswith("0.")
    assert snap.model_fingerprint == "llama-2-13b"
    assert snap.prompt_tokens is not None and snap.generation_tokens is not None
    assert snap.prompt_tokens.count == 4
    assert snap.prompt_tokens.sum == sum(prompts)
    assert dict(snap.prompt_tokens.buckets)[200.0] == 1  # 1-2-5 buckets up to max_model_len, like vLLM
    assert dict(snap.prompt_tokens.buckets)[500.0] == 3
    assert snap.prompt_tokens.buckets[-2][0] == 2000.0  # the last finite bound ≤ 4096
    assert snap.generation_tokens.sum == 8 * len(prompts)
    assert snap.kv_cache_usage is not None and 0.0 <= snap.kv_cache_usage <= 1.0
    assert snap.preemptions_total == 0.0
    assert snap.requests_running == 0.0


def test_probe_sends_the_named_api_key(sim_server, monkeypatch) -> None:
    server = sim_server.start([*SIM, "--api-key", "s3cret-key"])
    denied = asyncio.run(probe(server.url))
    assert not denied.reachable
    assert denied.error is not None and "401" in denied.error and "--api-key-env" in denied.error
    monkeypatch.setenv("PROD_KEY", "s3cret-key")
    snap = asyncio.run(probe(server.url, api_key_env="PROD_KEY"))
    assert snap.reachable, snap.error
    assert snap.served_model == "llama-2-13b"
    monkeypatch.setenv("PROD_KEY", "wrong")
    wrong = asyncio.run(probe(server.url, api_key_env="PROD_KEY"))
    assert not wrong.reachable
    assert wrong.error is not None and "$PROD_KEY" in wrong.error and "wrong" not in wrong.error


def test_probe_of_a_closed_port_says_why() -> None:
    snap = asyncio.run(probe(f"http://127.0.0.1:{free_port()}", timeout_s=2))
    assert not snap.reachable
    assert snap.error is not None and "ConnectError" in snap.error
    assert snap.served_model is None and snap.prompt_tokens is None
    bad = asyncio.run(probe("not a url at all", timeout_s=2))
    assert not bad.reachable and bad.error


def test_fingerprint_of_a_local_model_dir_changes_with_its_config(tmp_path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 32}')
    (model / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    first = model_fingerprint(str(model), "served")
    assert first is not None and first.startswith("sha256:")
    assert model_fingerprint(str(model), "other-name") == first
    (model / "config.json").write_text('{"num_hidden_layers": 40}')
    assert model_fingerprint(str(model), "served") != first
    assert model_fingerprint("meta-llama/Llama-2-7b", None, "abc123") == "meta-llama/Llama-2-7b@abc123"
    assert model_fingerprint(None, "served") == "served"
    assert model_fingerprint(None, None) is None


def test_gpu_inventory_reads_the_simulated_host(sim_server) -> None:
    sim_server.start(SIM)  # the simulator registers its GPUs in this test's simulated host
    gpus = gpu_inventory("sim")
    assert len(gpus) >= 2
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert all(g.uuid.startswith("GPU-") and g.memory_total_mib > 20_000 for g in gpus)
