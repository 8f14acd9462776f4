"""The circuit breaker: machine faults stop a study after a few trials with the reason; a candidate's
own failures never do. The acceptance case runs the CLI against an engine whose CUDA driver is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotuner.store.db import Store
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult
from autotuner.tuner.breaker import CircuitBreaker, machine_fault_reason
from autotuner.tuner.infra_retry import _machine_fault
from autotuner.tuner.tune_summary import TuneSummary

CUDA_ERROR = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
              "calling NumCudaDevices() that might have caused CUDA init? Error 803: system has unsupported "
              "display driver / cuda driver combination")


def test_three_machine_faults_in_a_row_trip_it() -> None:
    breaker = CircuitBreaker()
    assert breaker.record(True, "port taken") is None
    assert breaker.record(True, "port taken") is None
    assert breaker.record(True, "NVML: GPU is lost") == "3 machine faults in a row, the last: NVML: GPU is lost"


def test_candidate_failures_reset_the_streak_and_never_trip_it() -> None:
    breaker = CircuitBreaker()
    for _ in range(20):
        assert breaker.record(False, "oom") is None
    for _ in range(10):  # one machine fault in three: under the rate, never three in a row
        assert breaker.record(True, "x") is None
        assert breaker.record(False, "oom") is None
        assert breaker.record(False, "oom") is None
    # Two in three is a rate that stops the run, though never three came in a row.
    trips = [breaker.record(fault, "port taken") for fault in (True, True, False) * 3]
    assert any(trips) and breaker.tripped == "5 of the last 10 trials were machine faults, the last: port taken"


def result(outcome: str, reason: str | None, tail: list[str] | None = None) -> TrialResult:
    return TrialResult(outcome, reason, {}, [], log_tail=tail or [])


@pytest.mark.parametrize(("trial", "machine"), [
    (result(Outcome.CRASH, "engine exited with code 1 during startup", ["INFO starting", CUDA_ERROR]), True),
    (result(Outcome.STARTUP_FAILED, "Engine core initialization failed. See root cause above.",
            ["OSError: /models/x is not a local folder and is not a valid model identifier listed on "
             "'https://huggingface.co/models'"]), True),
    (result(Outcome.CRASH, "engine exited with code 1 during startup",
            ["FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/config.json'"]), True),
    (result(Outcome.STARTUP_FAILED, "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization`", ["No such file or directory: '/tmp/noise'"]), False),
    (result(Outcome.OOM_CRASH, "torch.OutOfMemoryError: CUDA out of memory.", [CUDA_ERROR]), False),
    (result(Outcome.INVALID_FLAGS, "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128).",
            []), False),
    (result(Outcome.CRASH, "engine exited with code 1 during startup", ["ValueError: something about the config"]),
     False),
    (result(Outcome.TIMEOUT, "engine not ready within engine.startup_timeout_s", ["No such file or directory"]), False),
])
def test_what_counts_as_the_machines_fault(trial: TrialResult, machine: bool) -> None:
    assert (_machine_fault(trial) is not None) == machine


def test_the_reason_is_the_line_that_names_the_fault() -> None:
    line = f"(EngineCore pid=42) ERROR 11-30 12:00:00 [core.py:1] {CUDA_ERROR}"
    assert machine_fault_reason("engine exited with code 1", ["INFO ok", line]) == CUDA_ERROR


def test_exit_codes_of_a_summary() -> None:
    assert TuneSummary("s", 3, 3, 0, False).exit_code == 0
    assert TuneSummary("s", 0, 3, 0, False, stopped_reason="3 machine faults").exit_code == 1
    assert TuneSummary("s", 1, 3, 0, True, ended="interrupted").exit_code == 0  # resumable, said in the summary


def test_a_broken_cuda_driver_stops_the_study_after_three_trials(tmp_path: Path) -> None:
    """The engine exists and answers --version, but every start dies of the driver: 3 trials, exit 1."""
    engine = tmp_path / "vllm"
    starts = tmp_path / "starts"
    engine.write_text(f"#!{sys.executable}\nimport sys\nif '--version' in sys.argv:\n    print('0.32.0')\n"
                      f"    sys.exit(0)\nopen({str(starts)!r}, 'a').write('start\\n')\n"
                      f"print('INFO 11-30 12:00:00 [api_server.py:1] vLLM API server version 0.32.0', flush=True)\n"
                      f"print({CUDA_ERROR!r}, flush=True)\nsys.exit(1)\n")
    engine.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 4096}))
    scenario = tmp_path / "broken.yaml"
    db = tmp_path / "study.db"
    scenario.write_text(yaml.safe_dump({
        "name": "broken-driver",
        "engine": {"kind": "vllm", "command": [str(engine), "serve"], "model": str(model),
                   "flags": {"max-model-len": 2048}, "startup_timeout_s": 30, "release_timeout_s": 0.5},
        "monitor": {"kind": "host"},
        "workload": {"requests": {"count": 2, "prompt_tokens": 100, "output_tokens": 8}, "warmup_requests": 0},
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 4096, "log": True}},
        "budget": {"trials": 20}, "storage": f"sqlite:///{db}"}))
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(scenario), "--log-dir",
                           str(tmp_path / "logs")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home")})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "stopped: 3 machine faults in a row, the last:" in done.stdout
    assert "cuda driver combination" in done.stdout
    assert "interrupted" not in done.stdout and "autotuner export" not in done.stdout
    assert starts.read_text().count("start") == 3  # no retry of a fault no retry can fix
    store = Store(str(db))
    rows = store.trials(store.studies()[0].study_name)
    assert len(rows) == 3
    assert all(r.state == "FAIL" for r in rows)
