"""The study database fails under a running study: a full disk (a real, small tmpfs), a lock held by
another writer, a read-only mount. The tuner stops its engine, says what is wrong once (no traceback),
writes no half trial, and the next run resumes."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.store.db import Store
from tests.support.faults import (
    assert_engine_gone,
    child_env,
    fault_scenario,
    our_trials,
    registry_empty,
)
from tests.support.quickstart import optuna_trials, tune_cmd
from tests.support.waiting import wait_for


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"needs root to mount a small filesystem: {done.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs) that the test can fill."""
    root = tmp_path / "small"
    root.mkdir()
    _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root))
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _serving_engines(fault_dir: Path) -> set[str]:
    """Engine processes that have received a completion request so far."""
    return {f.name.split("-")[1] for f in fault_dir.glob("request-*")} if fault_dir.is_dir() else set()


def _fill(root: Path) -> None:
    # Unbuffered: a buffered file that hit ENOSPC raises it again from close(), outside the suppress.
    with open(root / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)


def _assert_consistent(db: Path) -> None:
    """Each of our rows belongs to a trial Optuna finished; no trial number twice."""
    ours = our_trials(db)
    numbers = [n for n, _, _ in ours]
    assert len(numbers) == len(set(numbers)), ours
    states = dict(optuna_trials(db))
    for number, _, state in ours:
        assert states.get(number) == state, f"trial {number}: ours {state}, Optuna {states.get(number)}"


def _assert_resumes(scenario: Path, db: Path, home: Path, trials: int, before: list[tuple[int, str]]) -> None:
    done = subprocess.run(tune_cmd(scenario, db, "--trials", str(trials)), env=child_env(AUTOTUNER_HOME=str(home)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    after = optuna_trials(db)
    assert [s for _, s in after].count("COMPLETE") == trials
    assert "RUNNING" not in [s for _, s in after]
    for number, state in before:
        if state == "COMPLETE":
            assert (number, "COMPLETE") in after, "a trial finished before the fault was lost"
    _assert_consistent(db)
    assert registry_empty(home)


def test_disk_full_mid_trial(home: Path, tmp_path: Path, small_fs: Path) -> None:
    scenario = fault_scenario(tmp_path, "ok", engine__env__FAULT_TOKEN_S="0.05")
    db = small_fs / "study.db"
    tuner = subprocess.Popen(tune_cmd(scenario, db, "--trials", "2"), env=child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        # The second trial's engine is serving: fill the disk under it.
        wait_for(lambda: len(_serving_engines(tmp_path / "fault")) >= 2, 60, "the second trial's workload")
        _fill(small_fs)
        out, err = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 1, err[-2000:]
    assert "Traceback" not in err + out
    assert err.count("error: ") == 1 and "database or disk is full" in err and "free space" in err
    for log in (home / "logs").rglob("engine-*.log"):
        assert_engine_gone(log)
    assert registry_empty(home)
    before = optuna_trials(db)
    assert (0, "COMPLETE") in before
    _assert_consistent(db)  # the trial in flight left no row of ours
    (small_fs / "filler").unlink()
    _assert_resumes(scenario, db, home, 2, before)


class _Writer:
    """Another process's write transaction on the database (BEGIN EXCLUSIVE: WAL readers go on,
    writers wait)."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def test_database_locked_by_another_writer(home: Path, tmp_path: Path) -> None:
    scenario = fault_scenario(tmp_path, "ok", engine__env__FAULT_TOKEN_S="0.05")
    db = tmp_path / "study.db"
    env = child_env(AUTOTUNER_SQLITE_TIMEOUT_S="2")
    tuner = subprocess.Popen(tune_cmd(scenario, db, "--trials", "2"), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(_serving_engines(tmp_path / "fault")) >= 2, 60, "the second trial's workload")
        writer = _Writer(db)  # and never lets go while this tuner runs
        out, err = tuner.communicate(timeout=60)
        writer.release()
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 1, err[-2000:]
    assert "Traceback" not in err + out
    assert err.count("error: ") == 1 and "database is locked" in err and "another process" in err
    for log in (home / "logs").rglob("engine-*.log"):
        assert_engine_gone(log)
    before = optuna_trials(db)
    _assert_consistent(db)
    _assert_resumes(scenario, db, home, 2, before)


def test_a_short_lock_is_waited_for(home: Path, tmp_path: Path) -> None:
    """A dashboard or a backup holding the lock for a moment is not a fault: the study waits."""
    scenario = fault_scenario(tmp_path, "ok", engine__env__FAULT_TOKEN_S="0.05")
    db = tmp_path / "study.db"
    tuner = subprocess.Popen(tune_cmd(scenario, db, "--trials", "1"), env=child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _serving_engines(tmp_path / "fault"), 60, "the trial's workload")
        writer = _Writer(db)
        # Held until the trial is over and the tuner is saving it, then a little longer.
        wait_for(lambda: registry_empty(home), 60, "the engine to stop")
        time.sleep(1.0)
        writer.release()
        _, err = tuner.communicate(timeout=120)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 0, err[-2000:]
    states = optuna_trials(db)
    assert [n for n, state in states if state == "COMPLETE"] == [0] and "RUNNING" not in dict(states).values()
    _assert_consistent(db)


def test_read_only_database(home: Path, tmp_path: Path) -> None:
    """A study database on a read-only mount: one message, exit non-zero, no engine started."""
    scenario = fault_scenario(tmp_path, "ok")
    rw = tmp_path / "rw"
    rw.mkdir()
    db = rw / "study.db"
    Store(str(db)).optuna_storage()  # an existing study database, our tables and Optuna's
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount("--bind", str(rw), str(ro))
    try:
        _mount("-o", "remount,bind,ro", str(ro))
        started = time.time()
        done = subprocess.run(tune_cmd(scenario, ro / "study.db", "--trials", "2"), env=child_env(),
                              capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    assert done.returncode in (1, 2), done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    # The preflight finds it before the study opens ("not writable"); past it, SQLite says "read-only".
    said = done.stderr.lower()
    assert done.stderr.count("error: ") == 1 and ("read-only" in said or "not writable" in said), done.stderr
    assert not [p for p in (home / "logs").rglob("engine-*.log") if p.stat().st_mtime >= started]
    assert optuna_trials(db) == []
