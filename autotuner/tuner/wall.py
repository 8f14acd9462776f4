"""The OOM wall as the trials so far draw it, so that a candidate certain to run out of memory is
never launched.

GPU memory grows with the token budget and the utilization, and shrinks with the weights moved to
the host — in vLLM and in the simulator alike. So a candidate that is at least as large as a trial
that already ran out of memory, in every such flag, with every other flag equal, runs out too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotuner.scenario import FlagValue

# +1: more memory as the value grows; -1: less.
MONOTONE = {
    "max-num-batched-tokens": +1,
    "gpu-memory-utilization": +1,
    "max-num-seqs": +1,
    "max-model-len": +1,
    "cpu-offload-gb": -1,
}


@dataclass(frozen=True)
class OomPoint:
    trial_number: int
    flags: dict[str, FlagValue]


class MemoryWall:
    def __init__(self) -> None:
        self.points: list[OomPoint] = []

    def add(self, trial_number: int, flags: Mapping[str, FlagValue]) -> None:
        self.points.append(OomPoint(trial_number, dict(flags)))

    def dominating(self, flags: Mapping[str, FlagValue]) -> OomPoint | None:
        """A trial that ran out of memory with flags no larger than these, if there is one."""
        for point in self.points:
            if _at_least_as_large(flags, point.flags):
                return point
        return None


def _at_least_as_large(candidate: Mapping[str, FlagValue], oom: Mapping[str, FlagValue]) -> bool:
    if set(candidate) != set(oom):
        return False
    for name, value in candidate.items():
        other = oom[name]
        direction = MONOTONE.get(name)
        if direction is None or isinstance(value, bool) or isinstance(other, bool):
            if value != other:
                return False
            continue
        try:
            if direction * (float(value) - float(other)) < 0:  # type: ignore[arg-type]
                return False
        except (TypeError, ValueError):
            return False
    return True
