from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from autotuner.errors import UserInputError
from autotuner.store.db import Store
from autotuner.view.study_status import run_status
from tests.support.studies import MakeStudy, StudyDb


def status(storage: str, study: str | None = None) -> str:
    buffer = io.StringIO()
    assert run_status(storage, study, console=Console(file=buffer, width=250)) == 0
    return buffer.getvalue()


def row_of(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{text}")


def test_lists_the_study(study_db: StudyDb) -> None:
    text = status(study_db.storage)
    cells = row_of(text, study_db.name)
    trials = Store(study_db.storage).trials(study_db.name)
    assert cells[1] == "quickstart"
    assert cells[2] == str(len(trials))  # complete
    assert cells[5] == str(sum(t.outcome in ("oom-threshold", "oom-crash") for t in trials))
    assert cells[7] == trials[0].outcome  # the baseline's


def test_known_counts(make_study: MakeStudy) -> None:
    study = make_study()
    cells = row_of(status(study.storage), "known-front")
    assert cells[2:8] == ["8", "0", "4", "1", "100.0", "oom-threshold"]


def test_trials_of_one_study(make_study: MakeStudy) -> None:
    study = make_study()
    text = status(study.storage, "known-front")
    assert row_of(text, "2")[3] == "front"
    assert row_of(text, "4")[3] == "yes"
    assert "misses ttft_p95_s ≤ 10.00 s" in row_of(text, "5")[-1]
    assert "requests failed" in row_of(text, "6")[-1]
    assert "memory peak 98.0% ≥ threshold 97%" in row_of(text, "7")[-1]


def test_empty_and_missing_storage(tmp_path: Path) -> None:
    Store(str(tmp_path / "empty.db"))
    assert "no study in" in status(str(tmp_path / "empty.db"))
    with pytest.raises(UserInputError, match="no such database file"):
        status(str(tmp_path / "missing.db"))
    assert not (tmp_path / "missing.db").exists()


def test_prints_to_stdout_by_default(make_study: MakeStudy, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert run_status(make_study().storage) == 0
    assert "known-front" in capsys.readouterr().out
