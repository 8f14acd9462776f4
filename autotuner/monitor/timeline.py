"""A memory timeline of bounded size that never loses a peak.

A trial can run for an hour at 100 Hz; the timeline goes into SQLite and a plot, so it is kept as
buckets of consecutive samples, each holding the per-device maximum of its samples and the time of
its first sample. When the buckets reach twice the target count, neighbours merge pairwise and the
bucket width doubles: memory stays O(max_points) and a spike of a single sample survives every merge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TimelinePoint = tuple[float, list[int]]


def _merge(a: TimelinePoint, b: TimelinePoint) -> TimelinePoint:
    return a[0], [max(x, y) for x, y in zip(a[1], b[1], strict=True)]


def downsample_max(points: list[TimelinePoint], max_points: int) -> list[TimelinePoint]:
    """At most ``max_points`` points: consecutive groups of equal size, each its per-device max."""
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, not {max_points}")
    if len(points) <= max_points:
        return [(t, list(v)) for t, v in points]
    group = math.ceil(len(points) / max_points)
    out: list[TimelinePoint] = []
    for start in range(0, len(points), group):
        merged: TimelinePoint = (points[start][0], list(points[start][1]))
        for point in points[start + 1 : start + group]:
            merged = _merge(merged, point)
        out.append(merged)
    return out


@dataclass
class PeakTimeline:
    max_points: int = 600
    _buckets: list[TimelinePoint] = field(default_factory=list)
    _width: int = 1  # samples per full bucket
    _fill: int = 0  # samples in the last bucket

    def __post_init__(self) -> None:
        if self.max_points < 1:
            raise ValueError(f"max_points must be at least 1, not {self.max_points}")

    def add(self, t_s: float, values: list[int]) -> None:
        if self._buckets and self._fill < self._width:
            self._buckets[-1] = _merge(self._buckets[-1], (t_s, values))
            self._fill += 1
            return
        self._buckets.append((t_s, list(values)))
        self._fill = 1
        if len(self._buckets) > 2 * self.max_points:
            self._compact()

    def _compact(self) -> None:
        old = self._buckets
        # The new last bucket is either a pair (full when both halves were) or the odd one out.
        pairs = len(old) // 2
        merged = [_merge(old[2 * i], old[2 * i + 1]) for i in range(pairs)]
        if len(old) % 2:
            merged.append(old[-1])
            last_fill = self._fill
        else:
            last_fill = self._width + self._fill
        self._buckets = merged
        self._width *= 2
        self._fill = last_fill

    def points(self) -> list[TimelinePoint]:
        return downsample_max(self._buckets, self.max_points)
