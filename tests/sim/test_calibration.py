"""The simulator reproduces the field reports it is calibrated on (virtual time, default calibration).

These are the issue's acceptance figures; if a calibration constant moves, one of these says which
report stopped holding.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotuner.sim.args import build_config, parse_args
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, evaluate

GIB = 1 << 30
SEED_CASE = ("llama-2-13b", "-tp", "8", "--sim-gpu", "rtx-3090", "--max-model-len", "8192")
# The seed's verification: 8 concurrent prompts of 3000–6000 tokens, 256 output tokens.
LONG_PROMPTS = SyntheticWorkload(prompts=8, prompt_tokens=(3000, 6000), output_tokens=256, concurrency=8)


def run(*argv: str, workload: SyntheticWorkload = LONG_PROMPTS) -> Evaluation:
    config = build_config(parse_args(list(argv)), {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    return evaluate(config, workload.requests(config.model.vocab_size), workload.concurrency)


def test_default_kv_cache_matches_the_facts_estimate() -> None:
    ev = run(*SEED_CASE)
    assert ev.kv_cache_tokens is not None
    assert 170_000 <= ev.kv_cache_tokens <= 200_000


def test_unchunked_prefill_at_util_080_ooms_at_run_time() -> None:
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.80", "--no-enable-chunked-prefill")
    assert ev.outcome == "oom"
    assert ev.oom_at_s is not None and ev.oom_at_s > 0
    assert ev.reason is not None and ev.reason.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert ev.metrics["failed"] > 0


def test_budget_1024_with_chunked_prefill_stays_under_20_gib() -> None:
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.80", "--max-num-batched-tokens", "1024")
    assert ev.outcome == "ok", ev.reason
    peaks = ev.memory["peak_bytes"]
    assert isinstance(peaks, list) and len(peaks) == 8
    assert max(peaks) <= 20 * GIB
    assert ev.metrics["completed"] == 8


def test_small_budget_costs_throughput_and_ttft() -> None:
    small = run(*SEED_CASE, "--gpu-memory-utilization", "0.80", "--max-num-batched-tokens", "256")
    large = run(*SEED_CASE, "--gpu-memory-utilization", "0.80", "--max-num-batched-tokens", "1024")
    assert small.outcome == large.outcome == "ok"
    assert small.metrics["output_tokens_per_s"] <= 0.75 * large.metrics["output_tokens_per_s"]
    assert small.metrics["ttft_p50_s"] > large.metrics["ttft_p50_s"]


def test_cpu_offload_trades_decode_speed_for_kv_cache() -> None:
    decode_heavy = SyntheticWorkload(prompts=16, prompt_tokens=(100, 200), output_tokens=256, concurrency=8)
    base = run(*SEED_CASE, workload=decode_heavy)
    offload = run(*SEED_CASE, "--cpu-offload-gb", "4", workload=decode_heavy)
    assert base.outcome == offload.outcome == "ok"
    assert offload.metrics["output_tokens_per_s"] * 5 <= base.metrics["output_tokens_per_s"]
    assert offload.kv_cache_tokens > base.kv_cache_tokens


def test_util_099_fails_at_startup_like_vllm() -> None:
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.99")
    assert ev.outcome == "startup-failed"
    assert "is less than desired GPU memory utilization (0.99" in (ev.reason or "")


def test_low_util_cannot_hold_one_max_length_request() -> None:
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.18")
    assert ev.outcome == "startup-failed"
    assert "To serve at least one request with the model's max seq len (8192)" in (ev.reason or "")
    none_left = run(*SEED_CASE, "--gpu-memory-utilization", "0.10")
    assert "No available memory for the cache blocks" in (none_left.reason or "")


def test_weights_that_do_not_fit_fail_to_load() -> None:
    ev = run("llama-2-70b", "-tp", "2", "--sim-gpu", "rtx-3090", "--max-model-len", "4096")
    assert ev.outcome == "startup-failed"
    assert "Failed to load model - not enough GPU memory" in (ev.reason or "")


def test_vllm_52871_rtx5090_budget_8192_long_prompts_oom(tmp_path) -> None:
    gpu = tmp_path / "rtx5090.yaml"
    gpu.write_text("name: rtx-5090\nmemory_gib: 31.36\nbandwidth_gbps: 1792\nfp16_tflops: 209\n"
                   "pcie_gbps: 50\nnvlink_gbps: 0\n")
    workload = SyntheticWorkload(prompts=4, prompt_tokens=(5800, 6200), output_tokens=64, concurrency=4)
    ev = run("llama-3-8b", "--sim-gpu", str(gpu), "--gpu-memory-utilization", "0.93",
             "--max-num-batched-tokens", "8192", workload=workload)
    assert ev.outcome == "oom"
    safe = run("llama-3-8b", "--sim-gpu", str(gpu), "--gpu-memory-utilization", "0.93",
               "--max-num-batched-tokens", "2048", workload=workload)
    assert safe.outcome == "ok"


def test_mistral_7b_on_4090_tracks_published_throughput() -> None:
    # Facts note §5: 256 in / 128 out at concurrency 4/8/16/32/48 → 210/377/644/975/1190 tok/s.
    published = {4: 210, 8: 377, 16: 644, 32: 975, 48: 1190}
    for concurrency, tok_s in published.items():
        workload = SyntheticWorkload(prompts=concurrency * 6, prompt_tokens=(256, 256), output_tokens=128,
                                     concurrency=concurrency)
        ev = run("mistral-7b", "--sim-gpu", "rtx-4090", "--max-model-len", "4096", workload=workload)
        assert ev.metrics["output_tokens_per_s"] == pytest.approx(tok_s, rel=0.2), concurrency


def test_preemption_when_kv_cache_is_short() -> None:
    workload = SyntheticWorkload(prompts=24, prompt_tokens=(3000, 4000), output_tokens=1500, concurrency=24)
    ev = run("llama-2-7b", "--sim-gpu", "rtx-3090", "--max-model-len", "6144",
             "--gpu-memory-utilization", "0.80", "--max-num-batched-tokens", "512", workload=workload)
    assert ev.outcome == "ok", ev.reason
    assert ev.preemptions > 0
    assert ev.metrics["completed"] == 24


def test_same_seed_same_json() -> None:
    argv = [sys.executable, "-m", "autotuner.sim", "evaluate", *SEED_CASE, "--prompts", "16",
            "--rate", "2", "--seed", "7", "--json"]
    env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "random"}
    first = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    second = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    assert first == second
    data = json.loads(first)
    assert data["outcome"] == "ok"
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p95_s",
                "ttft_p99_s", "tpot_p50_s", "e2e_p95_s", "completed", "failed"):
        assert key in data["metrics"]
    assert len(data["memory"]["peak_bytes"]) == 8 and 0 < data["memory"]["peak_fraction"] < 1
    other = subprocess.run([*argv[:-2], "8", "--json"], capture_output=True, text=True, env=env, check=True)
    assert json.loads(other.stdout)["metrics"] != data["metrics"]


def test_evaluate_cli_reports_invalid_flags_and_rejects_unknown_ones() -> None:
    base = [sys.executable, "-m", "autotuner.sim", "evaluate", "llama-2-7b"]
    bad = subprocess.run([*base, "--max-num-batched-tokens", "64", "--max-num-seqs", "128", "--json"],
                         capture_output=True, text=True)
    assert bad.returncode == 0
    assert json.loads(bad.stdout)["outcome"] == "invalid-flags"
    unknown = subprocess.run([*base, "--nope"], capture_output=True, text=True)
    assert unknown.returncode == 2
    assert "unrecognized arguments: --nope" in unknown.stderr
