"""Confirmation runs by engine lifetime, and where the run-to-run spread lives.

Confirmation may replay the workload several times on one engine (trust/confirm.py). Replays of one
lifetime are not independent measurements: whatever a restart changes (clocks, allocator layout,
what torch.compile picked) they share. So every interval and every racing test stands on lifetimes,
never on replays: a lifetime's figure is the mean of its replays, and those means are the
observations, as each run was before replays existed. What replays buy is a lifetime mean with less
of the within-lifetime spread in it — worth a replay's time only where that spread is a real part of
the whole (`replays_pay`, decided once two rounds of lifetimes have replayed).

A confirm trial's `lifetime` (in its result) is the round it was measured in; a trial without one
(recorded before replays) is a lifetime of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome


def lifetime_of(t: TrialRecord) -> tuple[int, int | str]:
    """(the original it confirms, which of its lifetimes)."""
    confirms = t.result.get("confirms")
    lifetime = t.result.get("lifetime")
    original = int(confirms) if isinstance(confirms, int) else t.trial_number
    return original, lifetime if isinstance(lifetime, int) and not isinstance(lifetime, bool) else f"t{t.trial_number}"


def _ok(t: TrialRecord) -> bool:
    return t.outcome == Outcome.OK and t.state == "COMPLETE"


def lifetime_values(rows: Iterable[TrialRecord], metric: str,
                    transform: Callable[[float], float | None] = float) -> list[list[float]]:
    """Per lifetime (in the order first seen), the ok replays' values of `metric` after `transform`."""
    groups: dict[tuple[int, int | str], list[float]] = {}
    for t in rows:
        value = t.metrics.get(metric)
        if not _ok(t) or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        v = transform(float(value))
        if v is not None:
            groups.setdefault(lifetime_of(t), []).append(v)
    return list(groups.values())


def lifetime_means(rows: Iterable[TrialRecord], metric: str,
                   transform: Callable[[float], float | None] = float) -> list[float]:
    """One observation per lifetime: the mean of its replays."""
    return [sum(vs) / len(vs) for vs in lifetime_values(rows, metric, transform)]


@dataclass(frozen=True)
class Split:
    """Run-to-run variance of one metric (log space), split into within one lifetime and between."""

    within: float
    within_df: int
    between: float
    between_df: int

    @property
    def within_share(self) -> float:
        total = self.within + self.between
        return self.within / total if total > 0 else 0.0


def _log(value: float) -> float | None:
    return math.log(value) if value > 0 else None


def split(confirm_runs: Sequence[TrialRecord], metric: str) -> Split | None:
    """The within-lifetime variance, pooled over the lifetimes that replayed, and the between-lifetime
    variance from the spread of each original's lifetime means about their mean: E[s²] = between +
    within · mean(1/n) for means of n replays. Confirmation runs only — a search run was picked for
    being good, and its luck would pass for spread between lifetimes. None until both have a degree
    of freedom (two lifetimes of one original, one of them replayed)."""
    ss_w, df_w = 0.0, 0
    ss_b, df_b, inverse_n = 0.0, 0, []
    per_original: dict[int, list[TrialRecord]] = {}
    for t in confirm_runs:
        if t.kind == "confirm":
            per_original.setdefault(lifetime_of(t)[0], []).append(t)
    for rows in per_original.values():
        lifetimes = lifetime_values(rows, metric, _log)
        means = [sum(vs) / len(vs) for vs in lifetimes]
        for vs, mean in zip(lifetimes, means, strict=True):
            ss_w += sum((v - mean) ** 2 for v in vs)
            df_w += len(vs) - 1
        if len(means) > 1:
            grand = sum(means) / len(means)
            ss_b += sum((m - grand) ** 2 for m in means)
            df_b += len(means) - 1
            inverse_n += [1 / len(vs) for vs in lifetimes]
    if not df_w or not df_b:
        return None
    within = ss_w / df_w
    between = ss_b / df_b - within * sum(inverse_n) / len(inverse_n)
    return Split(within, df_w, max(0.0, between), df_b)


def replays_pay(confirm_runs: Sequence[TrialRecord], metrics: Sequence[str]) -> bool:
    """Replay within a lifetime while, on every objective, the within-lifetime variance is at least
    the between-lifetime one: a second replay then cuts a lifetime mean's variance by a quarter or
    more. Otherwise (or with no estimate yet) each repeat is a restart, as it must be when the spread
    is per lifetime."""
    splits = [split(confirm_runs, m) for m in metrics]
    return bool(splits) and all(s is not None and s.within >= s.between for s in splits)
