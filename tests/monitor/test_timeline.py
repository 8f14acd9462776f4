"""The bounded timeline keeps every peak however long the run."""

from __future__ import annotations

import random

import pytest

from autotuner.monitor import PeakTimeline, downsample_max


def test_a_long_run_fits_the_bound_and_keeps_every_isolated_spike() -> None:
    rng = random.Random(7)
    timeline = PeakTimeline(max_points=600)
    spikes = {i * 5000 + rng.randrange(5000): 1000 + i for i in range(20)}  # distinct heights
    for k in range(100_000):
        base = rng.randrange(100)
        timeline.add(k * 0.01, [spikes.get(k, base), base, 50])
    points = timeline.points()

    assert len(points) <= 600
    assert len(points) > 300  # coarsened only as far as needed
    times = [t for t, _ in points]
    assert times[0] == 0.0 and times == sorted(times)
    seen = {v[0] for _, v in points}
    assert set(spikes.values()) <= seen  # each spike, not just the largest
    for k, height in spikes.items():
        # The spike is in the bucket that starts at or before its time.
        assert any(v[0] == height and t <= k * 0.01 for t, v in points)
    assert max(v[1] for _, v in points) == 99
    assert {v[2] for _, v in points} == {50}


def test_short_runs_are_kept_sample_by_sample() -> None:
    timeline = PeakTimeline(max_points=600)
    for k in range(10):
        timeline.add(k / 100, [k])
    assert timeline.points() == [(k / 100, [k]) for k in range(10)]


def test_downsample_max_groups_consecutive_points() -> None:
    points = [(float(k), [k % 7, 1]) for k in range(10)]
    assert downsample_max(points, 3) == [(0.0, [3, 1]), (4.0, [6, 1]), (8.0, [2, 1])]
    assert downsample_max(points, 10) == points
    with pytest.raises(ValueError, match="at least 1"):
        downsample_max(points, 0)
