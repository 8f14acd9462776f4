from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.analysis.selection import select
from autotuner.errors import UserInputError
from autotuner.store.db import Store, StudyRecord
from tests.support.studies import MakeStudy, StudyDb, key_for, trial


@pytest.mark.parametrize(("policy", "expected"), [("max-throughput", 1), ("min-ttft", 3), ("knee", 2)])
def test_policies_on_a_known_front(make_study: MakeStudy, policy: str, expected: int) -> None:
    study = make_study()
    chosen = select(study.storage, "known-front", [], policy)
    assert chosen.chosen.trial_number == expected
    assert sorted(t.trial_number for t in chosen.analysis.front) == [1, 2, 3]
    # Infeasible trials never compete: 5 misses the scenario SLO, 6 lost requests, 7 ran above the threshold.
    assert sorted(t.trial_number for t in chosen.analysis.candidates) == [1, 2, 3, 4]
    assert chosen.baseline is not None and chosen.baseline.kind == "baseline" and chosen.baseline.trial_number == 0


def test_user_slos_narrow_the_choice(make_study: MakeStudy) -> None:
    study = make_study()
    assert select(study.storage, None, ["ttft_p95<=2s"], "max-throughput").chosen.trial_number == 3
    assert select(study.storage, None, ["output_tokens_per_s>=95"], "min-ttft").chosen.trial_number == 1
    assert select(study.storage, None, ["e2e_p95<=10500ms"], "max-throughput").chosen.trial_number == 2


def test_no_trial_meets_the_slo_names_the_best_seen(make_study: MakeStudy) -> None:
    study = make_study()
    with pytest.raises(UserInputError) as err:
        select(study.storage, None, ["ttft_p95<=500ms"], "knee")
    message = str(err.value)
    assert "ttft_p95_s ≤ 500.0 ms" in message
    assert "0 of 5 feasible trials" in message
    assert "best seen 1.00 s (trial 3)" in message
    assert "--slo 'ttft_p95<=1000ms'" in message


def test_no_feasible_trial(make_study: MakeStudy) -> None:
    study = make_study([trial(0, None, None, kind="baseline", outcome="oom-threshold", peak=0.99),
                        trial(1, None, None, outcome="oom-crash", peak=1.0)])
    with pytest.raises(UserInputError, match=r"no feasible trial \(2 trials: 1 oom-threshold, 1 oom-crash\)"):
        select(study.storage, None, [], "knee")


def test_real_study(study_db: StudyDb) -> None:
    picks = {p: select(study_db.storage, None, [], p) for p in ("max-throughput", "min-ttft", "knee")}
    trials = Store(study_db.storage).trials(study_db.name)
    # Feasible by hand: ran to the end, under the 97 % threshold, no failed request, TTFT p95 within 10 s.
    feasible = [t for t in trials if t.outcome == "ok" and t.memory["peak_fraction"] < 0.97
                and t.metrics["failed"] == 0 and t.metrics["ttft_p95_s"] <= 10.0]
    assert feasible
    best = max(feasible, key=lambda t: t.metrics["output_tokens_per_s"])
    fastest = min(feasible, key=lambda t: t.metrics["ttft_p95_s"])
    assert picks["max-throughput"].chosen.trial_number == best.trial_number
    assert picks["min-ttft"].chosen.trial_number == fastest.trial_number
    assert picks["knee"].chosen.trial_number in {t.trial_number for t in picks["knee"].analysis.front}
    baseline = picks["knee"].baseline
    assert baseline is not None and (baseline.kind, baseline.trial_number) == ("baseline", 0)


def test_missing_storage_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    with pytest.raises(UserInputError, match="no such database file"):
        select(str(path), None, [], "knee")
    assert not path.exists()


def test_storage_without_studies(tmp_path: Path) -> None:
    Store(str(tmp_path / "empty.db"))  # our tables, no study
    with pytest.raises(UserInputError, match="holds no study"):
        select(str(tmp_path / "empty.db"), None, [], "knee")
    (tmp_path / "other.db").write_bytes(b"")  # a SQLite file of someone else's: no tables at all
    with pytest.raises(UserInputError, match="holds no autotuner study"):
        select(str(tmp_path / "other.db"), None, [], "knee")


def test_study_without_trials(make_study: MakeStudy) -> None:
    study = make_study([])
    with pytest.raises(UserInputError, match="has no finished trial yet"):
        select(study.storage, None, [], "knee")


def test_study_not_found_lists_the_others(make_study: MakeStudy) -> None:
    study = make_study()
    with pytest.raises(UserInputError, match=r"study 'nope' is not in .*; studies there: known-front"):
        select(study.storage, "nope", [], "knee")


def test_latest_study_by_default(make_study: MakeStudy) -> None:
    old = make_study(name="old", created_at=1000.0)
    store = Store(old.storage)
    store.save_study(StudyRecord("new", "quickstart", key_for(old.scenario), old.scenario.model_dump(mode="json"),
                                 None, 2000.0))
    store.save_trial("new", trial(0, 80.0, 3.0, kind="baseline"))
    picked = select(old.storage, None, [], "knee")
    assert picked.study.name == "new" and picked.chosen.trial_number == 0
    assert picked.study.note is not None and "2 studies" in picked.study.note
    assert select(old.storage, "old", [], "knee").study.name == "old"


def test_unknown_policy(make_study: MakeStudy) -> None:
    with pytest.raises(UserInputError, match="--policy 'best'"):
        select(make_study().storage, None, [], "best")
