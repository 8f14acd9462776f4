"""The tuner SIGKILLed in each phase of a trial (starting, workload, stopping, saving), and SIGTERM /
SIGHUP while exporting: the next run stops the orphaned engine, loses at most the trial in flight,
duplicates nothing; an export is whole or absent."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotuner.engine.registry import group_members
from autotuner.scenario import load_scenario
from autotuner.store.db import Store
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner
from tests.support.faults import (
    child_env,
    fault_scenario,
    our_trials,
    registry_empty,
    sim_scenario,
)
from tests.support.quickstart import optuna_trials, tune_cmd
from tests.support.waiting import wait_for

TRIALS = 2


def _engines(home: Path) -> list[int]:
    engines = home / "engines"
    return [int(p.stem) for p in engines.glob("*.json")] if engines.is_dir() else []


def _engine_logs(home: Path) -> list[Path]:
    return sorted((home / "logs").rglob("engine-*.log"))


def _serving(fault_dir: Path) -> bool:
    return fault_dir.is_dir() and any(fault_dir.glob("request-*"))


def _kill_and_resume(scenario: Path, db: Path, home: Path, at_phase: Callable[[], None]) -> None:
    """Start `tune`, call `at_phase` (returns when the phase is reached), SIGKILL the tuner, run it
    again to the end, and check that nothing was lost, duplicated or left running."""
    tuner = subprocess.Popen(tune_cmd(scenario, db, "--trials", str(TRIALS)), env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        at_phase()
        pgids = _engines(home)
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(timeout=30)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    before = optuna_trials(db)
    done = subprocess.run(tune_cmd(scenario, db, "--trials", str(TRIALS)), env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for pgid in pgids:
        assert not group_members(pgid), f"the orphaned engine (process group {pgid}) is still running"
    assert registry_empty(home)
    after = optuna_trials(db)
    states = [s for _, s in after]
    assert states.count("COMPLETE") == TRIALS and "RUNNING" not in states, after
    for number, state in before:
        if state == "COMPLETE":
            assert (number, "COMPLETE") in after, "a trial finished before the kill was lost"
    ours = our_trials(db)
    numbers = [n for n, _, _ in ours]
    assert len(numbers) == len(set(numbers)), f"a trial was recorded twice: {ours}"
    assert sorted(n for n, _, s in ours if s == "COMPLETE") == [n for n, s in after if s == "COMPLETE"]
    # At most the trial in flight was lost: it was failed as interrupted and measured again.
    lost = [n for n, s in after if s == "FAIL"]
    assert len(lost) <= 1, after


def test_sigkill_while_starting(home: Path, tmp_path: Path) -> None:
    scenario = sim_scenario(tmp_path)

    def starting() -> None:
        wait_for(lambda: _engines(home), 120, "the first engine to be launched", interval=0.01)
        logs = _engine_logs(home)
        assert not any("Starting vLLM API server" in p.read_text() for p in logs), "already serving"

    _kill_and_resume(scenario, tmp_path / "study.db", home, starting)


def test_sigkill_during_the_workload(home: Path, tmp_path: Path) -> None:
    scenario = fault_scenario(tmp_path, "ok", engine__env__FAULT_TOKEN_S="0.05")
    _kill_and_resume(scenario, tmp_path / "study.db", home,
                     lambda: wait_for(lambda: _serving(tmp_path / "fault"), 120, "the workload"))


def test_sigkill_while_stopping(home: Path, tmp_path: Path) -> None:
    # The engine takes its time to stop (it ignores SIGTERM until the group SIGKILL): kill the tuner then.
    scenario = fault_scenario(tmp_path, "slow-stop")
    _kill_and_resume(scenario, tmp_path / "study.db", home,
                     lambda: wait_for((tmp_path / "fault" / "sigterm").exists, 120, "the engine's stop"))


def test_sigkill_while_saving(home: Path, tmp_path: Path) -> None:
    # Another writer holds the database when the trial ends: the tuner is blocked writing the trial.
    scenario = fault_scenario(tmp_path, "ok", engine__env__FAULT_TOKEN_S="0.05")
    db = tmp_path / "study.db"
    held: list[sqlite3.Connection] = []

    def saving() -> None:
        wait_for(lambda: _serving(tmp_path / "fault"), 120, "the workload")
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        held.append(conn)
        wait_for(lambda: registry_empty(home), 60, "the engine to stop")
        time.sleep(0.5)  # the tuner is now waiting on the lock to write the trial

    try:
        tuner = subprocess.Popen(tune_cmd(scenario, db, "--trials", str(TRIALS)), env=child_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            saving()
            os.kill(tuner.pid, signal.SIGKILL)
            tuner.wait(timeout=30)
        finally:
            if tuner.poll() is None:
                tuner.kill()
    finally:
        for conn in held:
            conn.execute("ROLLBACK")
            conn.close()
    before = optuna_trials(db)
    assert (0, "RUNNING") in before, before  # killed before the trial was written
    assert our_trials(db) == []
    done = subprocess.run(tune_cmd(scenario, db, "--trials", str(TRIALS)), env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = optuna_trials(db)
    assert [s for _, s in after].count("COMPLETE") == TRIALS and (0, "FAIL") in after, after
    ours = our_trials(db)
    assert sorted(n for n, _, s in ours if s == "COMPLETE") == [n for n, s in after if s == "COMPLETE"]
    assert len({n for n, _, _ in ours}) == len(ours)
    assert registry_empty(home)


@pytest.fixture
def exported_study(tmp_path: Path) -> tuple[Path, str]:
    """A finished study (virtual time) and what a clean export of it writes."""
    path = sim_scenario(tmp_path, name="virtual", engine__kind="sim-virtual")
    sc = load_scenario(path)
    db = tmp_path / "export.db"
    asyncio.run(Tuner(sc, VirtualRunner(sc), Store(str(db)), n_trials=4, seed=3).run())
    out = tmp_path / "clean.yaml"
    done = subprocess.run(_export(db, out), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return db, out.read_text()


def _export(db: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "autotuner", "export", "--storage", str(db), "--format", "yaml", "-o", str(out),
            "--allow-unverified", "--force"]  # each export replaces the last one's file


def test_sigterm_and_sighup_while_exporting_never_leave_a_partial_file(
        tmp_path: Path, exported_study: tuple[Path, str]) -> None:
    db, clean = exported_study
    rng = random.Random(8)
    target = tmp_path / "out" / "vllm.yaml"
    target.parent.mkdir()
    t0 = time.monotonic()
    subprocess.run(_export(db, tmp_path / "timing.yaml"), capture_output=True, timeout=120, check=True)
    span = time.monotonic() - t0
    for i in range(8):
        if i == 4:
            target.write_text("previous: config\n")  # a signal must leave the previous file as it was
        previous = target.read_text() if target.exists() else None
        proc = subprocess.Popen(_export(db, target), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 1.0) * span)
        proc.send_signal(signal.SIGTERM if i % 2 else signal.SIGHUP)
        proc.wait(timeout=60)
        text = target.read_text() if target.exists() else None
        assert text in (previous, clean), f"kill {i}: the export is neither the previous file nor the whole one"
        assert [p.name for p in target.parent.iterdir()] in ([], [target.name]), list(target.parent.iterdir())
