"""`TrialResult`: what one trial measured, as the tuner tells Optuna and the store keeps it.

The dataclass's fields are the stored record (`to_dict` is the `result` column, byte for byte as
before); the properties are typed reads of the loose `metrics` and `memory` maps, so callers do not
spell their string keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from autotuner.trials.outcomes import Outcome
from autotuner.vllm import FlagValue

Metrics = dict[str, float | int | None]
# Told each phase a trial enters (starting, warm-up, replay, stopping), for the live view.
Phase = Callable[[str], None]


@dataclass
class TrialResult:
    outcome: Outcome
    reason: str | None
    flags: dict[str, FlagValue]
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    startup_s: float | None = None
    metrics: Metrics = field(default_factory=dict)
    memory: dict[str, object] = field(default_factory=dict)
    engine: dict[str, object] = field(default_factory=dict)
    time_scale: float = 1.0
    infrastructure: bool = False
    log_tail: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.outcome == Outcome.OK

    @property
    def peak_fraction(self) -> float | None:
        """The highest share of a card's memory in use during the trial (None: not measured)."""
        value = self.memory.get("peak_fraction")
        return value if isinstance(value, int | float) else None

    @property
    def failed_share(self) -> float:
        """Failed requests among those that ended (1.0 when none did)."""
        completed = self.metrics.get("completed") or 0
        failed = self.metrics.get("failed") or 0
        total = completed + failed
        return failed / total if total else 1.0

    def metric(self, name: str) -> float | int | None:
        """One measured figure (`output_tokens_per_s`, `ttft_p95_s`, …), None when not measured."""
        return self.metrics.get(name)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
