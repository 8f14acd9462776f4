"""Comparing the recommended config with a reference (vLLM's defaults, the user's current config) the way
a reader can trust: from re-measured runs, mean with its 95 % interval, and "no significant difference"
unless the means differ beyond the noise (a two-sample t test on the intervals' spread, pooled over the
configurations confirmed: analysis/evidence.py). A single run of either side is never turned into a
percentage claim: the search's one-shot figures carry the run-to-run noise and the winner was picked for
being lucky.

Every view that compares (report, export's line, certificate, status, the daemon) reads these
sentences, so they agree word for word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from autotuner.analysis.candidates import Analysis, choose
from autotuner.analysis.confirmed import confirmed_ranking
from autotuner.analysis.evidence import Confirmation, confirmations, higher_is_better, soaks
from autotuner.stats import Interval
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import TrialKind

# The figures compared, with how a person reads them: (metric, name, unit, digits).
COMPARED = (("output_tokens_per_s", "output", "tok/s", 1), ("ttft_p95_s", "TTFT p95", "s", 3))
NO_DIFFERENCE = "no significant difference"


class Verdict(StrEnum):
    BETTER = "better"  # significantly better on some figure, worse on none
    WORSE = "worse"  # the reference is significantly better on some figure, ours on none
    TIE = "tie"  # every compared interval overlaps
    TRADE_OFF = "trade-off"  # better on one figure, worse on another
    SAME = "same"  # the recommendation is the reference itself
    UNCONFIRMED = "unconfirmed"  # one side was not re-measured: nothing to claim
    UNMEASURED = "unmeasured"  # the reference failed or has no figures


def show(iv: Interval, unit: str, digits: int) -> str:
    """`313.5 ± 12.4 tok/s` (mean ± half of the 95 % interval)."""
    return f"{iv.mean:.{digits}f} ± {iv.half_width:.{digits}f} {unit}"


@dataclass(frozen=True)
class Difference:
    """One figure of the recommendation against the reference, both re-measured."""

    metric: str
    name: str
    unit: str
    digits: int
    ours: Interval
    theirs: Interval

    @property
    def bound(self) -> float:
        """The difference of the means that is beyond the noise at 95 %: √(h₁² + h₂²) of the half-widths,
        which for intervals on one pooled spread is the two-sample t test's t·s·√(1/n₁ + 1/n₂)."""
        return math.hypot(self.ours.half_width, self.theirs.half_width)

    @property
    def better(self) -> bool | None:
        """True when ours is significantly better, False when significantly worse, None when neither."""
        if self.ours.n < 2 or self.theirs.n < 2 or abs(self.ours.mean - self.theirs.mean) <= self.bound:
            return None
        return (self.ours.mean > self.theirs.mean) == higher_is_better(self.metric)

    def delta(self) -> str:
        """`+6.4 %` when the difference is beyond the noise, else `no significant difference`."""
        if self.better is None:
            return NO_DIFFERENCE
        change = (self.ours.mean - self.theirs.mean) / abs(self.theirs.mean) * 100 if self.theirs.mean else 0.0
        return f"{change:+.1f} %"

    def text(self) -> str:
        pair = f"{show(self.ours, self.unit, self.digits)} vs {show(self.theirs, self.unit, self.digits)}"
        noise = "within the noise" if self.better is None else "beyond the noise"
        return f"{self.name}: {self.delta()} ({pair} mean, {noise} at 95 %)"


@dataclass
class Comparison:
    """The recommendation (trial `ours`) against one reference trial."""

    label: str  # "your current config", "vLLM's defaults"
    reference: int | None
    ours: int
    verdict: Verdict
    differences: list[Difference] = field(default_factory=list)
    note: str = ""  # why nothing is claimed, for UNCONFIRMED / UNMEASURED

    @property
    def keep_reference(self) -> bool:
        """The reference is at least as good: recommend keeping it."""
        return self.verdict in (Verdict.TIE, Verdict.WORSE, Verdict.SAME)

    def sentence(self) -> str:
        """One line, the same in every view: what was measured, not what to do (`headline` and the
        export's recommendation say that, once, for the first reference)."""
        ref = f"{self.label} (trial {self.reference})"
        if self.verdict == Verdict.SAME:
            return f"{ref} is the recommendation itself"
        if self.verdict in (Verdict.UNCONFIRMED, Verdict.UNMEASURED):
            return f"against {ref}: {self.note}"
        figures = "; ".join(d.text() for d in self.differences)
        head = {Verdict.BETTER: f"better than {ref}",
                Verdict.WORSE: f"worse than {ref}",
                Verdict.TIE: f"{NO_DIFFERENCE} from {ref}",
                Verdict.TRADE_OFF: f"a trade-off against {ref}"}[self.verdict]
        return f"{head} — {figures}"

    def brief(self) -> str:
        """A table cell: `no significant difference vs vLLM's defaults`, `output +6.4 % vs …`."""
        who = "current config" if self.label == CURRENT_LABEL else "defaults"
        if self.verdict == Verdict.SAME:
            return f"is the {who}"
        if self.verdict in (Verdict.UNCONFIRMED, Verdict.UNMEASURED):
            return f"vs {who}: not compared ({'one run' if self.verdict == Verdict.UNCONFIRMED else 'it failed'})"
        if self.verdict == Verdict.TIE:
            return f"{NO_DIFFERENCE} vs {who}"
        return ", ".join(f"{d.name} {d.delta()}" for d in self.differences) + f" vs {who}"

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "reference": self.reference, "trial": self.ours, "verdict": str(self.verdict),
                "sentence": self.sentence(),
                "figures": {d.metric: {"ours": vars(d.ours), "reference": vars(d.theirs), "better": d.better}
                            for d in self.differences}}


CURRENT_LABEL = "your current config"


def reference_label(trial: TrialRecord) -> str:
    return CURRENT_LABEL if trial.kind == TrialKind.CURRENT else "vLLM's defaults"


def compare(ours: TrialRecord, reference: TrialRecord, confirmed: dict[int, Confirmation]) -> Comparison:
    label = reference_label(reference)
    out = Comparison(label, reference.trial_number, ours.trial_number, Verdict.UNCONFIRMED)
    if ours.trial_number == reference.trial_number or ours.flags == reference.flags:
        out.verdict = Verdict.SAME
        return out
    if reference.outcome != "ok":
        out.verdict = Verdict.UNMEASURED
        out.note = f"it did not run to the end ({reference.outcome}), so there is nothing to compare"
        return out
    mine, theirs = confirmed.get(ours.trial_number), confirmed.get(reference.trial_number)
    missing = [who for who, c in (("the recommendation", mine), (label, theirs)) if c is None]
    if missing:
        out.note = (f"{' and '.join(missing)} measured once only, so no difference is claimed; "
                    "`autotuner confirm` re-measures both")
        return out
    assert mine is not None and theirs is not None
    for metric, name, unit, digits in COMPARED:
        a, b = mine.intervals.get(metric), theirs.intervals.get(metric)
        if a is not None and b is not None:
            out.differences.append(Difference(metric, name, unit, digits, a, b))
    if not out.differences:
        out.note = "its re-measurements have no figures in common with the recommendation's"
        return out
    signs = {d.better for d in out.differences} - {None}
    out.verdict = (Verdict.TIE if not signs else Verdict.TRADE_OFF if len(signs) == 2
                   else Verdict.BETTER if True in signs else Verdict.WORSE)
    return out


def references(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The user's current config first (what they would replace), then vLLM's defaults."""
    current = [t for t in trials if t.kind == TrialKind.CURRENT][:1]
    baseline = [t for t in trials if t.kind == TrialKind.BASELINE][:1]
    return current + baseline


def comparisons(ours: TrialRecord, trials: list[TrialRecord], confirmed: dict[int, Confirmation]) -> list[Comparison]:
    return [compare(ours, ref, confirmed) for ref in references(trials)]


def recommended(analysis: Analysis, policy: str = "knee") -> tuple[TrialRecord | None, list[Comparison]]:
    """The trial a report or a status row recommends (the confirmed best, else the single-shot choice),
    as measured by the search, and how it compares with the references."""
    trials = analysis.study.trials
    confirmed = confirmations(trials)
    ranked = confirmed_ranking(policy, analysis, confirmed, soaks(trials))
    winner = (next(t for t in analysis.feasible if t.trial_number == ranked[0].trial_number) if ranked
              else choose(policy, analysis))
    return winner, (comparisons(winner, trials, confirmed) if winner is not None else [])


def headline(ours: TrialRecord | None, found: list[Comparison]) -> str:
    """The report's first line: keep the reference when nothing found is significantly better, else the
    recommendation with its comparison."""
    if ours is None:
        return "Nothing to recommend: no trial is feasible under the scenario's SLOs."
    first = found[0] if found else None
    if first is None:
        return f"Recommended: trial {ours.trial_number} (no reference config was measured to compare with)."
    if first.verdict == Verdict.SAME:
        return f"Keep {first.label}: it is the best configuration found (trial {first.reference})."
    if first.keep_reference:
        return (f"Keep {first.label} (trial {first.reference}): nothing found is significantly better — "
                + "; ".join(d.text() for d in first.differences) + ".")
    return f"Recommended: trial {ours.trial_number}, {first.sentence()}."
