from __future__ import annotations

import pytest

from autotuner.analysis.slo import combine, parse_slo
from autotuner.errors import UserInputError


@pytest.mark.parametrize(("text", "metric", "op", "limit"), [
    ("ttft_p95<=2s", "ttft_p95_s", "≤", 2.0),
    ("ttft_p95_s <= 2", "ttft_p95_s", "≤", 2.0),
    ("e2e_p95<1500ms", "e2e_p95_s", "<", 1.5),
    ("output_tokens_per_s>=500", "output_tokens_per_s", "≥", 500.0),
    ("TPOT_P50 > 20ms", "tpot_p50_s", ">", 0.02),
    ("failed<=0", "failed", "≤", 0.0),
])
def test_parse(text: str, metric: str, op: str, limit: float) -> None:
    slo = parse_slo(text)
    assert (slo.metric, slo.op) == (metric, op)
    assert slo.limit == pytest.approx(limit)


def test_comparison_semantics() -> None:
    le, lt = parse_slo("ttft_p95<=2s"), parse_slo("ttft_p95<2s")
    assert le.passes(2.0) and not lt.passes(2.0)
    assert le.passes(1.999) and not le.passes(2.001)
    assert not le.passes(None) and not le.passes(float("nan"))
    assert parse_slo("output_tokens_per_s>=500").passes(500) and not parse_slo("output_tokens_per_s>500").passes(500)


@pytest.mark.parametrize(("text", "says"), [
    ("ttft<=2s", "unknown metric 'ttft'"),
    ("output_tokens_per_s>=500ms", "not a latency"),
    ("ttft_p95==2s", "expected METRIC OP VALUE"),
    ("ttft_p95<=fast", "expected METRIC OP VALUE"),
    ("", "expected METRIC OP VALUE"),
])
def test_bad_slo(text: str, says: str) -> None:
    with pytest.raises(UserInputError, match=says):
        parse_slo(text)


def test_unknown_metric_lists_the_known_ones() -> None:
    with pytest.raises(UserInputError) as err:
        parse_slo("latency<=1s")
    assert "ttft_p95_s" in str(err.value) and "output_tokens_per_s" in str(err.value)


def test_combine_keeps_the_scenario_bounds() -> None:
    slos = combine({"ttft_p95_s": 10.0}, ["e2e_p95<20s"])
    assert [(s.metric, s.op, s.limit, s.source) for s in slos] == [
        ("ttft_p95_s", "≤", 10.0, "scenario"), ("e2e_p95_s", "<", 20.0, "--slo")]


@pytest.mark.parametrize("best", [1.0, 0.7311, 6.929323125713108])
def test_suggestion_is_met_by_the_best_value(best: float) -> None:
    slo = parse_slo("ttft_p95<=0.1s")
    suggested = parse_slo(slo.suggest(best))
    assert suggested.passes(best)
    assert suggested.limit <= best + 0.001
