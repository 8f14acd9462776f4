"""The interval arithmetic and the `--confirm K×R` syntax."""

from __future__ import annotations

import math
import statistics

import pytest

from autotuner.errors import UserInputError
from autotuner.stats import interval, next_run, pooled_log_sd, t975
from autotuner.trust.commands import parse_confirm


def test_t_interval_of_three_runs() -> None:
    iv = interval([1.0, 2.0, 3.0])
    assert iv is not None and iv.mean == 2.0 and iv.n == 3
    assert iv.half_width == pytest.approx(4.303 / math.sqrt(3))  # t(0.975, 2) × s / √n, s = 1
    assert interval([5.0]) == interval([5.0, math.nan])  # one value: no spread to speak of
    assert interval([]) is None


def test_an_interval_on_a_pooled_spread() -> None:
    """Two runs on their own stand on t = 12.7; on a relative spread pooled with 6 more degrees of
    freedom, on t(7) = 2.365 and the larger of that spread and their own."""
    steady = [[100.0, 102.0, 98.0], [200.0, 204.0, 196.0], [50.0, 51.0, 49.0], [80.0, 81.6]]
    pooled = pooled_log_sd(steady)
    assert pooled is not None and pooled[1] == 7 and pooled[0] == pytest.approx(0.02, rel=0.05)
    alone, shared = interval([80.0, 81.6]), interval([80.0, 81.6], pooled)
    assert alone is not None and shared is not None and shared.mean == alone.mean == 80.8
    assert alone.half_width == pytest.approx(12.706 * 1.1314 / math.sqrt(2), rel=1e-3)
    assert shared.half_width == pytest.approx(2.365 * pooled[0] * 80.8 / math.sqrt(2), rel=1e-3)
    noisy = interval([60.0, 100.0], pooled)  # its own spread (36 %) is far above the pool's: it keeps it
    assert noisy is not None and noisy.half_width == pytest.approx(2.365 * 0.3612 * 80.0 / math.sqrt(2), rel=1e-2)
    one = interval([80.0], pooled)  # one run: a width from the others' spread (never a claim: compare.py)
    assert one is not None and one.n == 1 and one.half_width == pytest.approx(2.365 * pooled[0] * 80.0, rel=1e-3)
    assert interval([80.0, 81.6], (0.02, 1)) == alone  # no more degrees of freedom than its own: its own


def test_where_one_more_run_falls() -> None:
    """mean ± t·s·√(1 + 1/n): wider than the mean's interval by √(n + 1), the range a single later run
    (verify) is held against; from the pooled spread where that has more degrees of freedom."""
    iv, ahead = interval([1.0, 2.0, 3.0]), next_run([1.0, 2.0, 3.0])
    assert iv is not None and ahead is not None and ahead.mean == 2.0 and ahead.n == 3
    assert ahead.half_width == pytest.approx(4.303 * math.sqrt(1 + 1 / 3))
    assert ahead.half_width == pytest.approx(iv.half_width * 2)  # √(n + 1) = 2
    pooled = (0.02, 8)
    one = next_run([100.0], pooled)
    assert one is not None and one.half_width == pytest.approx(2.306 * 0.02 * 100.0 * math.sqrt(2))
    assert next_run([100.0]) is None and next_run([]) is None  # one run alone: no spread to say it with


@pytest.mark.parametrize("text, plan", [("3x3", (3, 3, 2)), ("2×5", (2, 5, 2)), (" 1 * 2 ", (1, 2, 2)),
                                        ("0", (0, 0, 0)), ("3x3x1", (3, 3, 1)), ("2×3×4", (2, 3, 4))])
def test_confirm_plan(text: str, plan: tuple[int, int, int]) -> None:
    assert parse_confirm(text) == plan


@pytest.mark.parametrize("text", ["3", "3x1", "0x3", "x3", "three", "3x3x0", "3x3x"])
def test_bad_confirm_plan_names_the_syntax(text: str) -> None:
    with pytest.raises(UserInputError, match="K×R such as 3x3"):
        parse_confirm(text)


def test_next_high_on_a_pooled_spread() -> None:
    from autotuner.stats import next_high

    agree = [0.9602, 0.9608, 0.9604, 0.9606]
    mean = statistics.fmean(agree)
    own = next_high(agree)
    assert own is not None and own < 0.962
    # The pool's spread, at its degrees of freedom, where it says more than the values do.
    pooled = next_high(agree, (0.005, 10))
    assert pooled == pytest.approx(mean + t975(10) * 0.005 * math.sqrt(1 + 1 / 4))
    # Fewer degrees of freedom in the pool than the values' own: the values' own.
    assert next_high(agree, (0.005, 2)) == own
    # One value: the pool alone gives it a bound; without one, none.
    assert next_high([0.95], (0.005, 10)) == pytest.approx(0.95 + t975(10) * 0.005 * math.sqrt(2))
    assert next_high([0.95]) is None
