"""One trial end to end on the simulator: real engine process, real HTTP, simulated NVML."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotuner.engine.gpu_locks import GpusBusyError
from autotuner.engine.registry import group_members
from autotuner.scenario import Scenario, load_scenario
from autotuner.sim.gpu_state import GpuHost
from autotuner.sim.worker_pool import WorkerPool
from autotuner.tuner.lifecycle import measure, measure_lifetime
from tests.support.quickstart import scenario


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_state: Path) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def run(sc: Scenario, tmp_path: Path, **flags: object):
    return asyncio.run(measure(sc, flags, log_dir=tmp_path / "logs"))


def test_ok_trial_reports_everything(home: Path, tmp_path: Path) -> None:
    phases: list[str] = []
    sc = load_scenario(scenario(tmp_path))
    result = asyncio.run(measure(sc, {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8},
                                 log_dir=tmp_path / "logs", on_phase=phases.append))
    assert result.outcome == "ok", result.reason
    assert phases == ["starting", "warm-up", "replay", "stopping"]
    m = result.metrics
    assert m["completed"] == 8 and m["failed"] == 0
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s"):
        assert m[key] is not None and m[key] > 0, key
    mem = result.memory
    assert len(mem["peak_bytes"]) == 8
    assert 0.75 < mem["peak_fraction"] < 0.9  # 19.5 GiB of 23.69
    assert mem["samples"] > 50 and mem["sample_hz"] > 50
    assert result.engine["kv_cache_tokens"] == 159_056
    assert result.engine["max_num_batched_tokens"] == 1024
    assert result.engine["version"] == "0.32.0"
    assert 0 < result.engine["kv_cache_usage_max"] < 1
    assert result.engine["preemptions"] == 0
    assert result.time_scale == 20
    assert Path(result.engine["log_path"]).is_file()
    assert "--max-num-batched-tokens" in result.argv and "127.0.0.1" in result.argv
    # Nothing is left: no engine process, no memory held.
    assert GpuHost(Path(os.environ["AUTOTUNER_SIM_STATE_DIR"])).used_bytes(0) == 0


def test_replays_within_one_engine_lifetime(home: Path, tmp_path: Path) -> None:
    """Confirmation's replays: one start, the workload three times, a result for each; the lifetime's
    memory peak on every one of them."""
    phases: list[str] = []
    sc = load_scenario(scenario(tmp_path))
    flags = {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8}
    results = asyncio.run(measure_lifetime(sc, flags, runs=3, log_dir=tmp_path / "logs", on_phase=phases.append))
    assert phases == ["starting", *["warm-up", "replay"] * 3, "stopping"]
    assert [r.outcome for r in results] == ["ok"] * 3, [r.reason for r in results]
    assert all(r.metrics["completed"] == 8 and r.metrics["output_tokens_per_s"] for r in results)
    assert len({r.engine["log_path"] for r in results}) == 1
    assert len({r.memory["peak_fraction"] for r in results}) == 1 and results[0].memory["samples"] > 50
    assert results[1].duration_s < results[0].duration_s, "only the first replay carries the start and stop"
    # Each replay's prompts are its own: none finds the last one's KV blocks in the prefix cache.
    rates = [r.metrics["output_tokens_per_s"] for r in results]
    assert max(rates) < 1.25 * min(rates), rates
    assert GpuHost(Path(os.environ["AUTOTUNER_SIM_STATE_DIR"])).used_bytes(0) == 0
    # A lifetime that fails is asked for no more replays.
    tripped = asyncio.run(measure_lifetime(sc, {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.94},
                                           runs=3, log_dir=tmp_path / "logs"))
    assert [r.outcome for r in tripped] == ["oom-threshold"]


def test_a_large_step_in_a_thin_headroom_trips_the_oom_threshold(home: Path, tmp_path: Path) -> None:
    # vLLM's defaults serve these prompts (sim/memory.py); budget 4096 at util 0.94 climbs past 0.97.
    result = run(load_scenario(scenario(tmp_path)), tmp_path,
                 **{"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.94})
    assert result.outcome == "oom-threshold"
    assert "threshold" in (result.reason or "")
    assert result.memory["peak_fraction"] >= 0.97


def test_unchunked_prefill_crashes_with_cuda_oom(home: Path, tmp_path: Path) -> None:
    # From util 0.96 the first unchunked prompt's step fails its allocation (sim/memory.py); the steady
    # footprint is then above the usual 0.97 threshold, so the threshold is moved out of the way.
    result = run(load_scenario(scenario(tmp_path, oom_threshold__fraction=0.999)), tmp_path,
                 **{"enable-chunked-prefill": False, "gpu-memory-utilization": 0.96})
    assert result.outcome == "oom-crash"
    assert (result.reason or "").startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_invalid_flags_and_startup_failures(home: Path, tmp_path: Path) -> None:
    sc = load_scenario(scenario(tmp_path))
    bad = run(sc, tmp_path, **{"max-num-batched-tokens": 64, "max-num-seqs": 128})
    assert bad.outcome == "invalid-flags"
    assert "must be greater than or equal to max_num_seqs (128)" in (bad.reason or "")
    low = run(sc, tmp_path, **{"gpu-memory-utilization": 0.18})
    assert low.outcome == "startup-failed"
    assert "To serve at least one request" in (low.reason or "")


def test_startup_timeout(home: Path, tmp_path: Path) -> None:
    sc = load_scenario(scenario(tmp_path, engine__startup_timeout_s=0.5, engine__sim__speedup=1))
    result = run(sc, tmp_path)
    assert result.outcome == "timeout"


def test_busy_gpus_are_refused_naming_the_pid(home: Path, tmp_path: Path, sim_state: Path) -> None:
    sc = load_scenario(scenario(tmp_path))
    from autotuner.backends import backend_for

    backend_for(sc).prepare_gpus(sc)
    with WorkerPool(sim_state, [3]) as pool:
        pool.set_bytes([2 << 30])
        with pytest.raises(GpusBusyError, match=rf"GPU 3: 2048 MiB held by python\S* \(pid {pool.pids[0]}, 2048 MiB\)"
                           ".*monitor.foreign_allowance_mib = 1024 MiB"):
            run(sc, tmp_path)


def test_measure_cli_json_and_bad_input(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "autotuner", "measure", str(scenario(tmp_path)),
           "--set", "max-num-batched-tokens=1024", "--set", "gpu-memory-utilization=0.8", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["outcome"] == "ok"
    assert data["flags"]["max-num-batched-tokens"] == 1024
    for key in ("startup_s", "metrics", "memory", "engine", "time_scale", "reason"):
        assert key in data
    bad = subprocess.run([sys.executable, "-m", "autotuner", "measure", str(tmp_path / "nope.yaml")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no such scenario file" in bad.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("engine:\n  kind: vllm\n  model: x\nworkload:\n  arrivals:\n    kind: poison\n")
    bad = subprocess.run([sys.executable, "-m", "autotuner", "measure", str(broken)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert f"{broken}:6: workload.arrivals.kind: must be one of" in bad.stderr
    bad = subprocess.run([*cmd[:5], "--set", "novalue"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr


def test_sigkill_of_measure_then_next_run_reaps_the_engine(home: Path, tmp_path: Path) -> None:
    path = scenario(tmp_path, workload__requests__count=64, workload__requests__output_tokens=256,
                    engine__sim__speedup=2)
    cmd = [sys.executable, "-m", "autotuner", "measure", str(path), "--set", "max-num-batched-tokens=1024",
           "--set", "gpu-memory-utilization=0.8"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    registry = home / "engines"
    deadline = time.monotonic() + 60
    pgids: list[int] = []
    while time.monotonic() < deadline and not pgids:
        pgids = [int(p.stem) for p in registry.glob("*.json")] if registry.is_dir() else []
        time.sleep(0.2)
    assert pgids, "the engine never registered"
    # Kill once the engine serves: measure announces each phase on stderr, replay comes after warm-up.
    assert proc.stderr is not None
    phases = []
    for line in proc.stderr:
        phases.append(line.strip())
        if line.strip() == "[replay]":
            break
    assert "[replay]" in phases, f"measure never reached the replay: {phases}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert group_members(pgids[0]), "the engine outlives the killed tuner"
    # The next run has to find and stop the orphan, then measure: the quick default workload proves that (the
    # long one above only keeps the first run in its replay until the kill).
    (tmp_path / "next").mkdir()
    again = subprocess.run([*cmd[:4], str(scenario(tmp_path / "next")), "--set", "max-num-batched-tokens=1024",
                            "--set", "gpu-memory-utilization=0.8"], capture_output=True, text=True, timeout=300)
    assert not group_members(pgids[0])
    assert again.returncode == 0, again.stderr
