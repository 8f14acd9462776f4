"""The simulator as a real process over real HTTP, seen by clients and by NVML."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from autotuner.sim import nvml
from tests.support.waiting import wait_for

SEED = ["llama-2-13b", "-tp", "8", "--max-model-len", "8192", "--sim-speedup", "100"]
WORDS = " ".join(f"w{i:03d}" for i in range(1000))  # 1000 tokens under the simulator's scheme


def used_gib(index: int) -> float:
    nvml.nvmlInit()
    try:
        return nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).used / (1 << 30)
    finally:
        nvml.nvmlShutdown()




def group_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def test_port_closed_until_ready_then_serves(sim_server) -> None:
    server = sim_server.start([*SEED, "--sim-speedup", "10"], wait_ready=False)
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=1)
    assert wait_for(lambda: _health(server.url) == 200, timeout=20), server.log()
    log = server.log()
    assert "GPU KV cache size: 188,544 tokens" in log
    assert "Chunked prefill is enabled with max_num_batched_tokens=2048." in log
    assert "Model loading took 3.03 GiB memory" in log
    assert "Available KV cache memory: 17.98 GiB" in log
    version = httpx.get(server.url + "/version").json()
    assert version["version"] == "0.32.0" and version["simulator"]["speedup"] == 10
    # NVML sees the engine's memory on all eight GPUs, held by eight worker processes.
    nvml.nvmlInit()
    try:
        assert nvml.nvmlDeviceGetCount() == 8
        for i in range(8):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            assert 21.5 < nvml.nvmlDeviceGetMemoryInfo(handle).used / (1 << 30) < 23.0
            assert len(nvml.nvmlDeviceGetComputeRunningProcesses(handle)) == 1
        assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA GeForce RTX 3090"
    finally:
        nvml.nvmlShutdown()


def _health(url: str) -> int:
    try:
        return httpx.get(url + "/health", timeout=1).status_code
    except httpx.TransportError:
        return 0


def test_streaming_usage_done_and_tokenize(sim_server) -> None:
    server = sim_server.start([*SEED, "--served-model-name", "m13"])
    body = {"model": "m13", "prompt": WORDS, "max_tokens": 12, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 1000, "completion_tokens": 12,
                                                         "total_tokens": 1012}
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    tok = httpx.post(server.url + "/tokenize", json={"model": "m13", "prompt": text}).json()
    assert tok["count"] == 12  # the generated text counts as the tokens it was
    assert httpx.post(server.url + "/tokenize", json={"prompt": WORDS}).json()["count"] == 1000
    metrics = httpx.get(server.url + "/metrics").text
    assert 'vllm:generation_tokens_total{engine="0",model_name="m13"} 12.0' in metrics
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m13"} 1000.0' in metrics
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="m13"} 1.0' in metrics
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:inter_token_latency_seconds_sum",
                 "vllm:request_queue_time_seconds_count", "vllm:iteration_tokens_total_bucket"):
        assert name in metrics


def test_openai_client_chat_and_completions(sim_server) -> None:
    server = sim_server.start([*SEED, "--api-key", "s3cret"])
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret")
    assert [m.id for m in client.models.list().data] == ["llama-2-13b"]
    chat = client.chat.completions.create(model="llama-2-13b", max_tokens=5,
                                          messages=[{"role": "user", "content": "hello there"}])
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 5
    stream = client.completions.create(model="llama-2-13b", prompt="a b c", max_tokens=4, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    parts = list(stream)
    assert parts[-1].usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200  # not protected, as in vLLM


def test_wrong_model_404_and_overlong_prompt_400(sim_server) -> None:
    server = sim_server.start([*SEED, "--max-model-len", "1024", "--served-model-name", "a", "b"])
    r = httpx.post(server.url + "/v1/completions", json={"model": "c", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `c` does not exist. Valid aliases: a, b."
    r = httpx.post(server.url + "/v1/completions", json={"model": "b", "prompt": WORDS + " " + WORDS})
    assert r.status_code == 400
    assert "maximum context length is 1024 tokens" in r.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/completions", content=b"{not json").status_code == 400


def test_sigterm_exits_0_and_releases_memory(sim_server) -> None:
    server = sim_server.start(SEED)
    pgid = server.proc.pid
    assert len(group_alive(pgid)) == 9  # the API server and eight TP workers
    assert used_gib(3) > 20
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 0
    assert wait_for(lambda: not group_alive(pgid), timeout=5)
    assert wait_for(lambda: used_gib(3) == 0, timeout=5)
    assert "Shutting down" in server.log()


def test_sigkill_orphans_workers_that_keep_memory(sim_server) -> None:
    server = sim_server.start(SEED)
    pgid = server.proc.pid
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=5)
    time.sleep(1.0)  # longer than the release delay: only live holders keep memory now
    orphans = group_alive(pgid)
    assert len(orphans) == 8
    assert used_gib(0) > 20
    # A new engine meets the orphans' memory: vLLM's startup check refuses it.
    second = sim_server.start(SEED, wait_ready=False)
    assert second.proc.wait(timeout=20) == 1
    assert "is less than desired GPU memory utilization (0.92" in second.log()
    os.killpg(pgid, signal.SIGKILL)
    assert wait_for(lambda: used_gib(0) == 0, timeout=5)


def test_startup_failure_exits_1_without_opening_the_port(sim_server) -> None:
    server = sim_server.start([*SEED, "--gpu-memory-utilization", "0.18"], wait_ready=False)
    assert server.proc.wait(timeout=20) == 1
    log = server.log()
    assert "To serve at least one request with the model's max seq len (8192)" in log
    assert "RuntimeError: Engine core initialization failed." in log
    assert "Starting vLLM API server" not in log
    assert wait_for(lambda: used_gib(0) == 0, timeout=5)


def test_runtime_oom_kills_the_engine_like_vllm(sim_server) -> None:
    # One unchunked 5000-token prefill needs more unprofiled memory than util 0.96 leaves (sim/memory.py).
    server = sim_server.start([*SEED, "--gpu-memory-utilization", "0.96", "--no-enable-chunked-prefill"])
    long_prompt = " ".join(f"{i:04d}" for i in range(5000))  # 5000 tokens: one unchunked prefill
    body = {"prompt": long_prompt, "max_tokens": 64, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["code"] == 500
    assert wait_for(lambda: server.proc.poll() is not None or _health(server.url) == 503, timeout=5)
    assert server.proc.wait(timeout=10) != 0
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in server.log()
    assert wait_for(lambda: used_gib(0) == 0, timeout=5)


def test_log_mentions_offload_and_cpu_offload_raises_kv(sim_server, tmp_path: Path) -> None:
    server = sim_server.start([*SEED, "--cpu-offload-gb", "1"])
    log = server.log()
    assert "Total CPU offloaded parameters: 8.0" in log
    assert "Model loading took 2.03 GiB memory" in log
