"""The simulator reproduces the field reports it is calibrated on (virtual time, default calibration).

These are the issue's acceptance figures; if a calibration constant moves, one of these says which
report stopped holding. The seed's own story (util 0.80, no chunked prefill → runtime OOM) is not
among them any more: the evidence-based memory model serves it, and fails it from util ≈ 0.93
(autotuner/sim/memory.py says why).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotuner.sim.args import build_config, parse_args
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, evaluate, synthetic_requests
from autotuner.sim.memory import runtime_step_bytes

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


def test_unchunked_prefill_at_util_080_serves_the_seed_prompts() -> None:
    # The seed's story (this OOMs) does not follow from the evidence (autotuner/sim/memory.py): at util
    # 0.80 the 4.4 GiB headroom per GPU holds what an 8192-token step never had profiled.
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.80", "--no-enable-chunked-prefill")
    assert ev.outcome == "ok", ev.reason
    assert ev.metrics["completed"] == 8


def test_unchunked_prefill_ooms_at_run_time_once_the_headroom_is_gone() -> None:
    # Without chunked prefill the budget is max_model_len (8192): from util ≈ 0.93 a full step's
    # unprofiled memory no longer fits in (1 − util) × total − context.
    ev = run(*SEED_CASE, "--gpu-memory-utilization", "0.94", "--no-enable-chunked-prefill")
    assert ev.outcome == "oom"
    assert ev.oom_at_s is not None and ev.oom_at_s > 0
    assert ev.reason is not None and ev.reason.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert ev.metrics["failed"] > 0
    # The same utilization with vLLM's default chunked budget (2048) leaves the step small enough.
    chunked = run(*SEED_CASE, "--gpu-memory-utilization", "0.94")
    assert chunked.outcome == "ok", chunked.reason


def test_unprofiled_step_memory_is_linear_in_the_step_tokens() -> None:
    # Facts note §6: no measured evidence of memory growing with the square of the chunk.
    config = build_config(parse_args(list(SEED_CASE)), {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    one, four = runtime_step_bytes(config, 2048), runtime_step_bytes(config, 8192)
    assert four == 4 * one


def test_vllm_48322_budget_shrinks_the_kv_pool_like_the_4090_report() -> None:
    # PR #48322: RTX 4090, Qwen3-8B, util 0.9: 40,464 KV tokens at budget 2048, 36,720 at 8192.
    short = SyntheticWorkload(prompts=4, prompt_tokens=(128, 256), output_tokens=16, concurrency=4)
    pools = {}
    for budget in (2048, 8192):
        ev = run("qwen3-8b", "--sim-gpu", "rtx-4090", "--gpu-memory-utilization", "0.9", "--max-model-len", "8192",
                 "--max-num-batched-tokens", str(budget), workload=short)
        assert ev.outcome == "ok", ev.reason
        pools[budget] = ev.kv_cache_tokens
    assert pools[2048] == pytest.approx(40_464, rel=0.08)
    assert pools[2048] - pools[8192] == pytest.approx(40_464 - 36_720, rel=0.10)


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
    # 256-token steps replay CUDA graphs (capture size 512), so the cost is the weights read per step,
    # not kernel launches: ~20 % here (it was ≥ 25 % while every prefill step paid eager launches).
    assert small.metrics["output_tokens_per_s"] <= 0.85 * large.metrics["output_tokens_per_s"]
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


def test_vllm_52872_rtx5090_budget_ladder() -> None:
    # RTX 5090, util 0.93, long prompts: budgets 2048 and 3072 serve, 4096 and 8192 die (Llama-3-8B
    # stands in for the report's hybrid model: same profiled bytes per token within 10 %).
    workload = SyntheticWorkload(prompts=4, prompt_tokens=(5800, 6200), output_tokens=64, concurrency=4)
    outcomes = {}
    for budget in (2048, 3072, 4096, 8192):
        ev = run("llama-3-8b", "--sim-gpu", "rtx-5090", "--gpu-memory-utilization", "0.93", "--max-model-len", "8192",
                 "--max-num-batched-tokens", str(budget), workload=workload)
        outcomes[budget] = ev.outcome
    assert outcomes == {2048: "ok", 3072: "ok", 4096: "oom", 8192: "oom"}


def test_mistral_7b_on_4090_tracks_published_throughput() -> None:
    # Facts note §5 / benchmarks/data/published_runs.yaml: 256 in / 128 out at concurrency 4/8/16/32/48,
    # 300 prompts → 210/377/644/975/1190 output tok/s. Output ÷ requests is ≈ 100 tokens there: the
    # requests stopped at EOS, so they run without ignore_eos here too.
    published = {4: 210, 8: 377, 16: 644, 32: 975, 48: 1190}
    for concurrency, tok_s in published.items():
        config = build_config(parse_args(["mistral-7b", "--sim-gpu", "rtx-4090", "--max-model-len", "4096"]), {})
        requests = synthetic_requests(300, lambda _r: 256, lambda _r: 128, seed=0, vocab_size=config.model.vocab_size,
                                      ignore_eos=False)
        ev = evaluate(config, requests, concurrency)
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
