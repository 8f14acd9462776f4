"""Issue 9 on the simulator, with real processes: other processes' GPU memory is measured, named,
budgeted against `monitor.foreign_allowance_mib`, fitted into the search space, and told apart from
the candidate's own memory when it grows during a trial."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
import structlog

from autotuner.backends import backend_for
from autotuner.scenario import load_scenario
from autotuner.store.db import Store
from autotuner.tuner.lifecycle import measure
from autotuner.tuner.runners import MeasureRunner
from autotuner.tuner.space import build_space, fit_utilization_to_free
from autotuner.tuner.study import Tuner
from tests.support.quickstart import scenario
from tests.support.sim_gpus import hold

MIB = 1 << 20
GOOD = {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8}
WIDE_UTIL = {"max-num-batched-tokens": {"type": "int", "low": 512, "high": 2048, "log": True},
             "gpu-memory-utilization": {"type": "float", "low": 0.7, "high": 0.99, "step": 0.01}}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_state: Path) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def holders() -> list[subprocess.Popen[str]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def box(tmp_path: Path, **changes: object) -> Path:
    """The quickstart's simulated 8x RTX 3090, set up before anyone holds memory on it."""
    path = scenario(tmp_path, **changes)
    sc = load_scenario(path)
    backend_for(sc).prepare_gpus(sc)
    return path


def test_desktop_memory_on_gpu0_is_a_named_baseline_and_clamps_utilization(
        home: Path, tmp_path: Path, sim_state: Path, holders: list[subprocess.Popen[str]]) -> None:
    path = box(tmp_path, search_space=WIDE_UTIL, workload__requests__count=6)
    desktop = hold(sim_state, "--gpu", "0", "--mib", "400")
    holders.append(desktop)
    sc = load_scenario(path)
    # Without the clamp, the top of the range cannot even start beside the desktop's memory.
    unfitted = asyncio.run(measure(sc, {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.99},
                                   log_dir=tmp_path / "logs"))
    assert unfitted.outcome == "startup-failed" and "Free memory on device" in (unfitted.reason or "")

    store = Store(str(tmp_path / "study.db"))
    tuner = Tuner(sc, MeasureRunner(sc, tmp_path / "logs"), store, n_trials=3, seed=1)
    assert build_space(sc).distributions["gpu-memory-utilization"].high == pytest.approx(0.99)  # type: ignore[attr-defined]
    summary = asyncio.run(tuner.run())
    high = tuner.space.distributions["gpu-memory-utilization"].high  # type: ignore[attr-defined]
    assert high == pytest.approx(0.96)  # (24258 - 400 - 512 MiB context margin) / 24258 MiB
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    assert {t.distributions["gpu-memory-utilization"].high for t in study.trials if t.distributions} == {high}  # type: ignore[attr-defined]
    assert summary.trials_done == 3
    rows = store.trials(tuner.study_name)
    launched = [r for r in rows if r.result.get("argv")]
    assert len(launched) == 3
    for row in launched:
        assert float(row.flags["gpu-memory-utilization"]) <= 0.96
        assert "Free memory on device" not in (row.reason or "")
        foreign = row.result["memory"]["foreign"]
        assert foreign[0]["bytes"] == 400 * MIB
        assert [p["pid"] for p in foreign[0]["processes"]] == [desktop.pid]
        assert foreign[0]["processes"][0]["name"].startswith("python")
        assert all(f["bytes"] == 0 for f in foreign[1:])
        if row.outcome == "ok":
            engine_peak = row.result["memory"]["engine_peak_bytes"]
            assert engine_peak[0] == row.result["memory"]["peak_bytes"][0] - 400 * MIB
    # The report shows our engine's peak and the other processes' memory apart.
    from autotuner.export.report import run_report

    assert run_report(store.url, tuner.study_name, tmp_path / "report") == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| our engine | other processes |" in report
    assert "0.39 GiB (python" in report and f"pid {desktop.pid})" in report


def test_fit_utilization_lowers_only_what_cannot_start(tmp_path: Path) -> None:
    total = 24 << 30
    default = build_space(load_scenario(scenario(tmp_path)))  # utilization up to 0.95
    assert fit_utilization_to_free(default, None) is default
    assert fit_utilization_to_free(default, (total, 400 * MIB)) is default  # 0.96 fits: untouched
    wide = build_space(load_scenario(scenario(tmp_path, search_space=WIDE_UTIL)))
    # Even an idle GPU cannot start at 0.99: the CUDA context sits outside the budget.
    idle = fit_utilization_to_free(wide, (total, 0)).distributions["gpu-memory-utilization"]
    assert idle.high == pytest.approx(0.97) and idle.low == pytest.approx(0.7)  # type: ignore[attr-defined]
    tight = fit_utilization_to_free(wide, (total, 12 << 30)).distributions["gpu-memory-utilization"]
    assert tight.high == pytest.approx(0.47) and tight.low == tight.high  # type: ignore[attr-defined]


def test_three_gib_foreign_on_gpu3_is_refused_naming_process_and_allowance(
        home: Path, tmp_path: Path, sim_state: Path, holders: list[subprocess.Popen[str]]) -> None:
    path = box(tmp_path)
    job = hold(sim_state, "--gpu", "3", "--mib", "3072")
    holders.append(job)
    db = tmp_path / "busy.db"
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(path), "--storage", str(db),
                           "--trials", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "GPU 3: 3072 MiB held by python" in done.stderr and f"(pid {job.pid}, 3072 MiB)" in done.stderr
    assert "monitor.foreign_allowance_mib = 1024 MiB" in done.stderr and "at least 3072" in done.stderr
    assert "Traceback" not in done.stderr
    # The refused trial is ended, not left RUNNING, and its candidate is queued again.
    with sqlite3.connect(db) as conn:
        states = sorted(s for (s,) in conn.execute("SELECT state FROM trials"))
    assert "RUNNING" not in states and states.count("FAIL") == 1
    study = optuna.load_study(study_name=_only_study(db), storage=f"sqlite:///{db}")
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed[0].user_attrs["outcome"] == "gpus-busy"
    assert f"pid {job.pid}" in failed[0].user_attrs["reason"]
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    again = [t.system_attrs["fixed_params"] for t in waiting if t.user_attrs.get("requeued_from") == failed[0].number]
    assert again == [failed[0].params]
    # Raising the allowance is the fix the message names: then the trial runs beside the job.
    raised = load_scenario(box(tmp_path, monitor__foreign_allowance_mib=4096))
    result = asyncio.run(measure(raised, GOOD, log_dir=tmp_path / "logs"))
    assert result.outcome == "ok", result.reason
    assert result.memory["foreign"][3]["bytes"] == 3072 * MIB


def _only_study(db: Path) -> str:
    names = optuna.get_all_study_names(f"sqlite:///{db}")
    assert len(names) == 1
    return names[0]


def test_memory_appearing_mid_trial_is_interference_and_the_trial_is_run_again(
        home: Path, tmp_path: Path, sim_state: Path, holders: list[subprocess.Popen[str]]) -> None:
    path = box(tmp_path, workload__requests__count=24, engine__sim__speedup=5)
    sc = load_scenario(path)
    store = Store(str(tmp_path / "study.db"))
    started = threading.Event()

    def on_event(kind: str, data: dict[str, object]) -> None:
        if kind == "phase" and data.get("phase") == "replay" and not started.is_set():
            started.set()
            job = hold(sim_state, "--gpu", "2", "--mib", "2000")
            holders.append(job)
            # Someone's job runs for a while, then ends: the re-run finds the GPU as it was.
            threading.Timer(2.0, job.send_signal, args=(signal.SIGTERM,)).start()

    tuner = Tuner(sc, MeasureRunner(sc, tmp_path / "logs"), store, n_trials=1, seed=1, on_event=on_event)
    with structlog.testing.capture_logs() as logs:
        summary = asyncio.run(tuner.run())
    assert started.is_set()
    retries = [e for e in logs if e["event"] == "trial.infrastructure_retry"]
    assert len(retries) == 1, [e["event"] for e in logs]
    job_pid = holders[0].pid
    assert "GPU 2: other processes' memory grew by 2000 MiB" in retries[0]["reason"]
    assert f"pid {job_pid}" in retries[0]["reason"]
    measured = [e for e in logs if e["event"] == "trial.measured"]
    assert measured[0]["outcome"] == "interference"
    assert measured[-1]["outcome"] != "interference"
    assert summary.trials_done == 1
    row = store.trials(tuner.study_name)[0]
    assert row.outcome == measured[-1]["outcome"] and row.state == "COMPLETE"


def test_container_view_counts_used_memory_as_baseline_with_a_warning(
        home: Path, tmp_path: Path, sim_state: Path, holders: list[subprocess.Popen[str]]) -> None:
    path = box(tmp_path)
    holders.append(hold(sim_state, "--gpu", "1", "--mib", "300", "--unlisted"))
    result = asyncio.run(measure(load_scenario(path), GOOD, log_dir=tmp_path / "logs"))
    assert result.outcome == "ok", result.reason
    foreign = result.memory["foreign"][1]
    assert foreign == {"index": 1, "bytes": 300 * MIB, "processes": [], "unlisted": True}
    assert any("no process listed (GPU 1 300 MiB)" in w and "another PID namespace" in w
               for w in result.warnings), result.warnings
