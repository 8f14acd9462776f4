from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from autotuner.errors import UserInputError
from autotuner.store.db import Store
from autotuner.view.study_status import run_status
from tests.support.studies import KNOWN_FRONT, MakeStudy, StudyDb, confirm_runs, trial


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
    assert cells[2:4] == [str(len(trials)), "0"]  # searched, re-runs: what tune's N/M counts and what came after
    assert cells[5] == str(sum(t.outcome in ("oom-threshold", "oom-crash") for t in trials))
    assert cells[6].endswith("tok/s (one run)")  # nothing was re-measured: the figure says so
    assert cells[7].startswith("vs defaults: not compared")


def test_known_counts(make_study: MakeStudy) -> None:
    study = make_study()
    cells = row_of(status(study.storage), "known-front")
    assert cells[2:8] == ["8", "0", "4", "1", "trial 2: 90.0 tok/s (one run)", "vs defaults: not compared (it failed)"]


def test_re_measured_figures_and_their_comparison(make_study: MakeStudy) -> None:
    runs = confirm_runs(9, 2, [(89.0, 4.0), (90.0, 4.1), (91.0, 4.2)])
    base = confirm_runs(12, 0, [(49.0, 8.0), (50.0, 8.1), (51.0, 8.2)])
    study = make_study([trial(0, 50.0, 8.0, kind="baseline"), *KNOWN_FRONT[1:], *runs, *base])
    cells = row_of(status(study.storage), "known-front")
    assert cells[2:4] == ["8", "6"]
    assert cells[6] == "trial 2: 90.0 ± 2.3 tok/s (mean, n=3)"
    assert cells[7] == "output +80.0 %, TTFT p95 -49.4 % vs defaults"


def test_outcomes_are_named_and_reasons_said_once(make_study: MakeStudy) -> None:
    long = "pruned: cannot reach the Pareto front " + "(output_tokens_per_s ≤ 110.6 at best) " * 6
    study = make_study([trial(0, 50.0, 8.0, kind="baseline"),
                        trial(1, None, None, outcome="oom-predicted",
                              reason="not launched: offload not needed: the same candidate without offload starts"),
                        trial(2, None, None, outcome="pruned", reason=long)])
    text = status(study.storage, "known-front")
    assert row_of(text, "1")[2] == "skipped: offload not needed"
    assert "pruned: pruned" not in text and "not launched" not in text
    assert "… (--trial 2)" in text  # cut at a word, the whole reason one command away
    buffer = io.StringIO()
    assert run_status(study.storage, "known-front", console=Console(file=buffer, width=100), trial=2) == 0
    whole = " ".join(buffer.getvalue().split())
    assert "trial 2 of study known-front: search, pruned" in whole
    assert " ".join(long.removeprefix("pruned: ").split()) in whole
    with pytest.raises(UserInputError, match="--trial 9"):
        run_status(study.storage, "known-front", trial=9)


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
