"""One study shared by several tuners through PostgreSQL (Optuna's own multi-worker mode), against a
real throwaway PostgreSQL server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.store.db import Store
from autotuner.tuner.budget import launched_trials
from tests.support.quickstart import quickstart

pgserver = pytest.importorskip("pgserver")


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.mark.parametrize("twin", ["--no-twin", "--twin"])
def test_two_workers_share_one_study(postgres: str, tmp_path: Path, twin: str) -> None:
    path = quickstart(tmp_path)
    cmd = [sys.executable, "-m", "autotuner", "tune", str(path), "--storage", postgres, "--study", twin[2:],
           "--trials", "16", "--confirm", "0", twin]
    workers = [subprocess.Popen([*cmd, "--seed", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for i in range(2)]
    outs = [w.communicate(timeout=300) for w in workers]
    for w, (_out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, err[-2000:]
    store = Store(postgres)
    study = optuna.load_study(study_name=twin[2:], storage=store.optuna_storage())
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    # Both check the study-wide count of engine runs before asking: at most one extra.
    # The sampler spends the budget; a twin ends the shared study once its finalists measure as predicted.
    assert (16 if twin == "--no-twin" else 3) <= len(launched_trials(study)) <= 17
    assert [t.user_attrs["kind"] for t in complete].count("baseline") == 1
    rows = store.trials(twin[2:])
    assert len({r.trial_number for r in rows}) == len(rows) == len(complete)
    assert not study.get_trials(states=(TrialState.RUNNING,))


def test_unreachable_postgres_is_bad_input(tmp_path: Path) -> None:
    path = quickstart(tmp_path)
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(path), "--storage",
                           "postgresql://tuner@127.0.0.1:1/none"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unreachable" in done.stderr
