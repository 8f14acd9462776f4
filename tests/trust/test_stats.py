"""The interval arithmetic and the `--confirm K×R` syntax."""

from __future__ import annotations

import math

import pytest

from autotuner.errors import UserInputError
from autotuner.stats import interval
from autotuner.trust.commands import parse_confirm


def test_t_interval_of_three_runs() -> None:
    iv = interval([1.0, 2.0, 3.0])
    assert iv is not None and iv.mean == 2.0 and iv.n == 3
    assert iv.half_width == pytest.approx(4.303 / math.sqrt(3))  # t(0.975, 2) × s / √n, s = 1
    assert interval([5.0]) == interval([5.0, math.nan])  # one value: no spread to speak of
    assert interval([]) is None


@pytest.mark.parametrize("text, plan", [("3x3", (3, 3, 2)), ("2×5", (2, 5, 2)), (" 1 * 2 ", (1, 2, 2)),
                                        ("0", (0, 0, 0)), ("3x3x1", (3, 3, 1)), ("2×3×4", (2, 3, 4))])
def test_confirm_plan(text: str, plan: tuple[int, int, int]) -> None:
    assert parse_confirm(text) == plan


@pytest.mark.parametrize("text", ["3", "3x1", "0x3", "x3", "three", "3x3x0", "3x3x"])
def test_bad_confirm_plan_names_the_syntax(text: str) -> None:
    with pytest.raises(UserInputError, match="K×R such as 3x3"):
        parse_confirm(text)
