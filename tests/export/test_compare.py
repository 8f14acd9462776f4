"""Comparisons a reader can trust (analysis/compare.py) and outcomes named for what happened
(analysis/wording.py): pure functions over real records, no study needed."""

from __future__ import annotations

import re

import pytest

from autotuner.analysis.compare import Verdict, compare, headline
from autotuner.analysis.evidence import confirmations
from autotuner.analysis.wording import bare_reason, outcome_text, shorten
from tests.support.studies import confirm_runs, trial

CHANGE = re.compile(r"[+-]\d+\.\d %")  # a claimed change, "+6.4 %"


def test_overlapping_intervals_are_no_significant_difference() -> None:
    ours, ref = trial(2, 310.0, 3.9), trial(1, 291.3, 4.0, kind="current")
    found = confirmations([*confirm_runs(3, 2, [(300.0, 3.9), (313.5, 4.0), (327.0, 4.1)]),
                           *confirm_runs(6, 1, [(301.0, 4.0), (315.2, 3.9), (329.4, 4.1)])])
    c = compare(ours, ref, found)
    assert c.verdict == Verdict.TIE and c.keep_reference
    assert c.sentence().startswith("no significant difference from your current config (trial 1) — output: no")
    assert "313.5 ± 22.2 tok/s vs 315.2 ± 22.8 tok/s mean" in c.sentence()  # t at the pooled 4 df
    assert not CHANGE.search(c.sentence())
    assert headline(ours, [c]).startswith("Keep your current config (trial 1): nothing found is significantly")


def test_a_reference_raced_out_after_two_runs_is_compared_on_the_pooled_spread() -> None:
    """Racing leaves a beaten reference two lifetimes. On their own, t = 12.7 made ±32 tok/s of a 3 %
    spread, and the quickstart's certificate called a 10 % loss no difference; on the spread of all five
    configurations' runs (5 degrees of freedom) the loss is beyond the noise."""
    ours, ref = trial(2, 122.0, 4.0), trial(0, 110.0, 4.0, kind="baseline")
    runs = [*confirm_runs(10, 2, [(120.0, 4.0), (124.0, 4.1), (122.0, 3.9)]),
            *confirm_runs(20, 4, [(118.0, 4.0), (121.0, 4.1), (123.0, 4.0)]),
            *confirm_runs(30, 0, [(107.0, 4.0), (112.0, 4.1)])]
    c = compare(ours, ref, confirmations(runs))
    assert c.verdict == Verdict.BETTER, c.sentence()
    assert "output: +11.4 %" in c.sentence() and "beyond the noise at 95 %" in c.sentence()
    assert c.differences[0].theirs.half_width < 8.0  # n = 2 on its own: ±31.8


def test_a_references_search_run_is_one_of_its_lifetimes() -> None:
    """vLLM's defaults were run for being the reference, not picked for being good: confirmation runs
    marked `reference` make its search run count in its interval; a candidate's never does."""
    ours, ref = trial(2, 130.0, 4.0), trial(0, 104.0, 4.0, kind="baseline")
    runs = [ours, ref, *confirm_runs(10, 2, [(120.0, 4.0), (124.0, 4.1), (122.0, 3.9)]),
            *confirm_runs(20, 0, [(110.0, 4.0), (112.0, 4.1)])]
    for t in runs[5:]:
        t.result["reference"] = True
    found = confirmations(runs)
    theirs, mine = found[0].intervals["output_tokens_per_s"], found[2].intervals["output_tokens_per_s"]
    assert found[0].search_run and not found[2].search_run
    assert theirs.n == 3 and theirs.mean == pytest.approx((104.0 + 110.0 + 112.0) / 3)
    assert mine.n == 3 and mine.mean == pytest.approx(122.0)  # its lucky 130 left out
    assert found[0].runs == [20, 21] and found[0].lifetimes == 2  # the engine starts confirmation spent
    assert compare(ours, ref, found).verdict == Verdict.BETTER


def test_a_noisier_configuration_does_not_borrow_the_others_steadiness() -> None:
    ours, ref = trial(2, 122.0, 4.0), trial(0, 110.0, 4.0, kind="baseline")
    runs = [*confirm_runs(10, 2, [(120.0, 4.0), (124.0, 4.1), (122.0, 3.9)]),
            *confirm_runs(20, 4, [(118.0, 4.0), (121.0, 4.1), (123.0, 4.0)]),
            *confirm_runs(30, 0, [(90.0, 4.0), (130.0, 4.1)])]  # the same mean, a 26 % spread of its own
    c = compare(ours, ref, confirmations(runs))
    assert c.verdict == Verdict.TIE, c.sentence()
    assert c.differences[0].theirs.half_width > 40.0


def test_intervals_apart_give_a_percentage_each_way() -> None:
    ours, ref = trial(2, 100.0, 4.0), trial(0, 50.0, 8.0, kind="baseline")
    found = confirmations([*confirm_runs(3, 2, [(99.0, 4.0), (101.0, 4.1)]),
                           *confirm_runs(5, 0, [(50.0, 8.0), (51.0, 8.2)])])
    better = compare(ours, ref, found)
    assert better.verdict == Verdict.BETTER and not better.keep_reference
    assert "output: +98.0 %" in better.sentence() and "TTFT p95: -50.0 %" in better.sentence()
    worse = compare(ref, ours, found)  # the same figures the other way round
    assert worse.verdict == Verdict.WORSE and worse.keep_reference


def test_a_trade_off_is_named() -> None:
    ours, ref = trial(2, 100.0, 8.0), trial(0, 50.0, 4.0, kind="baseline")
    found = confirmations([*confirm_runs(3, 2, [(99.0, 8.0), (101.0, 8.1)]),
                           *confirm_runs(5, 0, [(50.0, 4.0), (51.0, 4.1)])])
    assert compare(ours, ref, found).verdict == Verdict.TRADE_OFF


def test_a_single_run_claims_nothing() -> None:
    ours, ref = trial(2, 310.0, 3.9), trial(0, 291.3, 4.0, kind="baseline")
    c = compare(ours, ref, confirmations(confirm_runs(3, 2, [(300.0, 3.9), (313.5, 4.0)])))
    assert c.verdict == Verdict.UNCONFIRMED and not c.differences
    assert "vLLM's defaults measured once only, so no difference is claimed" in c.sentence()
    assert not CHANGE.search(c.sentence()) and c.brief() == "vs defaults: not compared (one run)"


def test_the_same_config_and_a_failed_reference() -> None:
    ours = trial(1, 100.0, 4.0)
    same = trial(0, 90.0, 4.0, kind="current", flags=ours.flags)
    assert compare(ours, same, {}).verdict == Verdict.SAME
    assert headline(ours, [compare(ours, same, {})]).startswith("Keep your current config: it is the best")
    failed = trial(0, None, None, kind="baseline", outcome="oom-threshold")
    assert compare(ours, failed, {}).verdict == Verdict.UNMEASURED


@pytest.mark.parametrize(("reason", "shown"), [
    ("not launched: offload not needed: the same candidate without offload starts", "skipped: offload not needed"),
    ("not launched: predicted peak 103.9% of a card", "skipped: predicted OOM"),
    ("not launched: cannot start: the model's weights …", "skipped: cannot start"),
    ("not launched: at least as large as trial 4, which ran out of memory", "skipped: like an OOM trial"),
])
def test_skipped_candidates_are_named_for_why(reason: str, shown: str) -> None:
    assert outcome_text(trial(3, None, None, outcome="oom-predicted", reason=reason)) == shown
    assert outcome_text(trial(3, None, None, outcome="pruned", reason="pruned: x")) == "pruned"


def test_a_reason_is_said_once_and_cut_at_a_word() -> None:
    assert bare_reason("pruned: pruned: cannot reach the front") == "cannot reach the front"
    text = "cannot reach the Pareto front (output_tokens_per_s ≤ 110.6, ttft_p95_s ≥ 5.754 at best)"
    cut = shorten(text, 40, "--trial 6")
    assert len(cut) <= 40 and cut.endswith("… (--trial 6)")
    assert text.startswith(cut.removesuffix("… (--trial 6)"))  # whole words only
    assert text.split()[len(cut.removesuffix("… (--trial 6)").split()) - 1] == cut.split("…")[0].split()[-1]
    assert shorten("short", 40, "--trial 6") == "short"
