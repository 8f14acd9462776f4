from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotuner.analysis.candidates import analyse
from autotuner.analysis.slo import scenario_slos
from autotuner.analysis.study_data import load_study
from autotuner.analysis.wording import outcome_text
from autotuner.errors import UserInputError
from autotuner.export.plots import memory_png
from autotuner.export.report import run_report
from autotuner.store.db import Store
from tests.support.studies import GIB, TOTAL, MakeStudy, StudyDb, confirm_runs, trial

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(data: bytes) -> None:
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a drawn figure, not an empty canvas


def test_report_files(study_db: StudyDb, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert run_report(study_db.storage, None, out) == 0
    # No timeline recorded: a sentence, not a plot of identical bars.
    assert sorted(p.name for p in out.iterdir()) == ["pareto.png", "report.html", "report.md"]
    assert_png((out / "pareto.png").read_bytes())
    md = (out / "report.md").read_text()
    trials = Store(study_db.storage).trials(study_db.name)
    assert study_db.name in md
    for section in ("## Study key", "## Pareto front", "## Recommended against the configs it would replace",
                    "## Memory", "## Trials"):
        assert section in md
    assert "](pareto.png)" in md and "No memory timeline to draw" in md
    trial_rows = [line for line in md.split("## Trials")[1].splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(trial_rows) == len(trials)
    table = md.split("## Trials")[1]
    for outcome in {outcome_text(t) for t in trials}:  # every outcome the study holds (OOM, pruned, ...)
        assert f"| {outcome} |" in table, outcome
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1
    assert 'src="pareto.png"' not in html  # self-contained
    assert "<table>" in html and study_db.name in html


def comparison_of(md: str) -> str:
    return md.split("## Recommended against")[1].split("## Memory", maxsplit=1)[0]


def test_single_runs_are_shown_as_such_and_never_compared(make_study: MakeStudy, tmp_path: Path) -> None:
    study = make_study([trial(0, 50.0, 8.0, kind="baseline"), trial(1, 100.0, 4.0), trial(2, 40.0, 2.0)])
    run_report(study.storage, None, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    comparison = comparison_of(md)
    assert "| output throughput (one run) | 50.0 tok/s | 100.0 tok/s | not compared: one run |" in comparison
    assert not re.search(r"[+-]\d+\.\d %", comparison.split("memory peak")[0])  # no change claimed
    assert md.splitlines()[2].startswith("**Recommended: trial ")  # the verdict leads, and claims nothing
    assert "measured once only, so no difference is claimed" in md.splitlines()[2]


def test_confirmed_intervals_apart_give_the_difference(make_study: MakeStudy, tmp_path: Path) -> None:
    study = make_study([trial(0, 50.0, 8.0, kind="baseline"), trial(1, 100.0, 4.0),
                        *confirm_runs(2, 1, [(99.0, 4.0), (101.0, 4.1), (100.0, 3.9)]),
                        *confirm_runs(5, 0, [(50.0, 8.0), (51.0, 8.1), (49.0, 7.9)])])
    run_report(study.storage, None, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    comparison = comparison_of(md)
    # The spread pooled over both (relative, 4 df), the larger of it and a side's own: 50 ± 1 is the noisier.
    assert "| output throughput (mean) | 50.0 ± 1.6 tok/s | 100.0 ± 2.5 tok/s | +100.0 % |" in comparison
    assert "| TTFT p95 (mean) | 8.000 ± 0.253 s | 4.000 ± 0.160 s | -50.0 % |" in comparison
    assert md.splitlines()[2].startswith("**Recommended: trial 1, better than vLLM's defaults (trial 0)")


def test_overlapping_intervals_say_keep_the_current_config(make_study: MakeStudy, tmp_path: Path) -> None:
    """The issue's case: a single-shot "+6.4 %" whose re-measured intervals overlap."""
    current = trial(1, 291.3, 4.0, kind="current", flags={"tensor-parallel-size": 2, "max-num-batched-tokens": 999})
    study = make_study([trial(0, 250.0, 6.0, kind="baseline"), current, trial(2, 310.0, 3.9),
                        *confirm_runs(3, 2, [(302.0, 3.8), (316.0, 3.9), (330.0, 4.0)]),
                        *confirm_runs(6, 1, [(298.0, 4.0), (313.5, 4.1), (329.0, 4.2)])])
    run_report(study.storage, None, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    lead = md.splitlines()[2]
    assert lead.startswith("**Keep your current config (trial 1): nothing found is significantly better")
    assert "no significant difference" in lead and "+6.4" not in md
    assert "| output throughput (mean) |" in comparison_of(md)
    assert "keep" in (tmp_path / "r" / "report.html").read_text().split("<h2>")[0].lower()


def test_failure_leaves_nothing(study_db: StudyDb, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="is not in"):
        run_report(study_db.storage, "no-such-study", tmp_path / "report")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserInputError, match="does not exist"):
        run_report(study_db.storage, None, tmp_path / "missing" / "report")


def test_existing_directory_keeps_other_files(study_db: StudyDb, tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "report.md").write_text("stale")
    run_report(study_db.storage, None, out)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "report.md").read_text().startswith("# Tuning report")
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # the staging directory is gone


def test_report_without_feasible_trial(make_study: MakeStudy, tmp_path: Path) -> None:
    study = make_study([trial(0, None, None, kind="baseline", outcome="oom-threshold", peak=0.99),
                        trial(1, None, None, outcome="oom-crash", peak=1.0)])
    assert run_report(study.storage, None, tmp_path / "r") == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "nothing to recommend" in md
    assert_png((tmp_path / "r" / "pareto.png").read_bytes())


def test_memory_plot_only_from_a_timeline(make_study: MakeStudy, tmp_path: Path) -> None:
    timeline = [[t / 10, [int(t / 100 * 0.9 * TOTAL)] * 2] for t in range(100)]
    study = make_study([trial(0, 80.0, 3.0, kind="baseline", timeline=timeline)])
    assert run_report(study.storage, None, tmp_path / "r") == 0
    assert_png((tmp_path / "r" / "memory.png").read_bytes())
    assert "](memory.png)" in (tmp_path / "r" / "report.md").read_text()


def test_memory_timeline_plot(make_study: MakeStudy) -> None:
    timeline = [[t / 10, [int(min(t, 50) / 50 * 0.9 * TOTAL), int(min(t, 50) / 50 * 0.85 * TOTAL)]]
                for t in range(100)]
    study = make_study([trial(0, 80.0, 3.0, kind="baseline", timeline=timeline)])
    data = load_study(study.storage, None)
    record = data.trials[0]
    assert record.timeline == timeline
    assert_png(memory_png(analyse(data, scenario_slos(data.scenario.slos)), record))
    assert max(v for _, vs in record.timeline for v in vs) < TOTAL - GIB // 2


def test_infeasible_trials_do_not_stretch_the_axes(study_db: StudyDb) -> None:
    """The tuner told Optuna placeholder values for OOM trials (up to 600 s TTFT); the plot shows only
    measured figures, and the OOM trials in the band below."""
    import matplotlib.pyplot as plt

    from autotuner.export.plots import pareto_figure

    data = load_study(study_db.storage, None)
    analysis = analyse(data, scenario_slos(data.scenario.slos))
    fig = pareto_figure(analysis, None)
    axes = {a.get_label(): a for a in fig.axes}
    main, band = axes["measured"], axes["infeasible"]
    measured = [t.metrics["ttft_p95_s"] for t in data.trials if t.outcome == "ok"]
    assert main.get_xlim()[1] < max(*measured, data.scenario.slos["ttft_p95_s"]) * 1.2  # the SLO line is drawn too
    ooms = {t.trial_number for t in data.trials if t.outcome != "ok"}
    assert ooms, "the fixture study should hold OOM trials"
    plotted = {int(x) for c in band.collections for x, _ in c.get_offsets()}
    assert plotted == ooms
    plt.close(fig)
