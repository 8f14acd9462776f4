"""Service-level objectives a deployed configuration must meet: `ttft_p95<=2s`, `e2e_p95<1500ms`,
`output_tokens_per_s>=500`, plus the scenario's own `slos` (each an upper bound, as the tuner reads them).

Metric names are those of `TrialRecord.metrics`; the `_s` suffix of latencies may be left out, and a
latency may carry a unit (s or ms). Limits are held in the metric's own unit (seconds, tokens/s).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import get_args

from autotuner.errors import UserInputError
from autotuner.scenario import Metric
from autotuner.units import seconds

# Every figure a finished trial holds that an SLO can name (the scenario's metrics and a few more).
METRICS: tuple[str, ...] = (*get_args(Metric), "completed", "failed", "queue_p95_s")

_OPS: dict[str, tuple[str, Callable[[float, float], bool]]] = {
    "<=": ("≤", operator.le), "≤": ("≤", operator.le), "=<": ("≤", operator.le),
    ">=": ("≥", operator.ge), "≥": ("≥", operator.ge), "=>": ("≥", operator.ge),
    "<": ("<", operator.lt), ">": (">", operator.gt),
}
_SLO = re.compile(r"^\s*([A-Za-z][\w]*)\s*(<=|>=|=<|=>|≤|≥|<|>)\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+)"
                  r"\s*(ms|s)?\s*$")
_EXAMPLES = "e.g. 'ttft_p95<=2s', 'e2e_p95<1500ms' or 'output_tokens_per_s>=500'"


def is_latency(metric: str) -> bool:
    return metric.endswith("_s") and not metric.endswith("_per_s")


@dataclass(frozen=True)
class Slo:
    metric: str
    op: str  # one of ≤ ≥ < >
    limit: float
    source: str = "--slo"  # or "scenario"

    def passes(self, value: float | int | None) -> bool:
        """A missing or non-finite figure never meets an SLO."""
        if value is None or not math.isfinite(float(value)):
            return False
        return bool(_OPS[self.op][1](float(value), self.limit))

    @property
    def higher_is_better(self) -> bool:
        return self.op in ("≥", ">")

    def show_value(self, value: float | int | None) -> str:
        if value is None:
            return "-"
        return seconds(value) if is_latency(self.metric) else f"{value:.4g}"

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.show_value(self.limit)}"

    def suggest(self, best: float) -> str:
        """The --slo text that the best value seen would meet (rounded outward, so it really does)."""
        name = self.metric.removesuffix("_s") if is_latency(self.metric) else self.metric
        op = ">=" if self.higher_is_better else "<="
        rounded = math.floor if self.higher_is_better else math.ceil
        if is_latency(self.metric):
            return f"{name}{op}{rounded(best * 1000)}ms"
        return f"{name}{op}{rounded(best)}"


def parse_slo(text: str) -> Slo:
    match = _SLO.match(text)
    if match is None:
        raise UserInputError(f"--slo {text!r}: expected METRIC OP VALUE[UNIT], {_EXAMPLES}")
    name, op, raw, unit = match.groups()
    metric = _metric(name, text)
    limit = float(raw)
    if unit is not None:
        if not is_latency(metric):
            raise UserInputError(f"--slo {text!r}: {metric} is not a latency, give a plain number without {unit}")
        if unit == "ms":
            limit /= 1000.0
    return Slo(metric, _OPS[op][0], limit)


def _metric(name: str, text: str) -> str:
    lowered = name.lower()
    for candidate in (lowered, lowered + "_s"):
        if candidate in METRICS:
            return candidate
    raise UserInputError(f"--slo {text!r}: unknown metric {name!r}; use one of {', '.join(METRICS)} "
                         "(the _s suffix of latencies may be left out)")


def scenario_slos(slos: Mapping[str, float]) -> list[Slo]:
    """The scenario's `slos:` are upper bounds (the tuner's constraint is value / limit - 1 ≤ 0)."""
    return [Slo(metric, "≤", float(limit), "scenario") for metric, limit in slos.items()]


def combine(scenario: Mapping[str, float], given: list[str]) -> list[Slo]:
    """The scenario's SLOs and the user's, all of which must hold (a user SLO can only tighten)."""
    return [*scenario_slos(scenario), *(parse_slo(text) for text in given)]
