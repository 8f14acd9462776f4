"""How a trial's outcome and reason read to a person: named for what happened, each said once, and
shortened at a word boundary with the command that shows the whole text.

The stored outcome stays what the rules test (`oom-predicted` covers every candidate the memory model
did not launch); only what is shown is named by the reason it was skipped.
"""

from __future__ import annotations

from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome

# Shown outcomes of the memory model's skips, by the phrase its reason starts with.
_SKIPS = (("offload not needed", "skipped: offload not needed"),
          ("cannot start", "skipped: cannot start"),
          ("predicted peak", "skipped: predicted OOM"),
          ("at least as large as trial", "skipped: like an OOM trial"),
          ("no more memory room than trial", "skipped: like a failed start"))
# Prefixes a stored reason may already carry, which the shown outcome says.
_PREFIXES = ("not launched: ", "pruned: ")


def outcome_text(trial: TrialRecord) -> str:
    """`skipped: offload not needed` rather than `oom-predicted`; other outcomes as stored."""
    return outcome_label(str(trial.outcome), trial.reason)


def outcome_label(outcome: str, reason: str | None) -> str:
    """The same for an outcome and reason as events carry them (the live view of `tune`)."""
    if outcome != Outcome.OOM_PREDICTED:
        return outcome
    bare = bare_reason(reason or "")
    return next((shown for start, shown in _SKIPS if bare.startswith(start)), "skipped: predicted OOM")


def bare_reason(reason: str) -> str:
    """The reason without the prefixes that repeat its outcome (`pruned: pruned: …`)."""
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if reason.startswith(prefix):
                reason, changed = reason[len(prefix):], True
    return reason


def shorten(text: str, limit: int = 160, more: str = "") -> str:
    """`text` cut at the last word boundary within `limit`, ending in `…` and, when given, where the
    whole text is (`more`: e.g. `autotuner status STUDY --trial 6`)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    tail = f"… ({more})" if more else "…"
    room = max(limit - len(tail), 1)
    cut = text[:room + 1].rsplit(" ", 1)[0] if " " in text[:room + 1] else text[:room]
    return cut.rstrip(" ,;:—-") + tail


def shown_counts(trials: list[TrialRecord]) -> str:
    """`14 ok, 2 skipped: offload not needed, 1 pruned`: outcomes as shown, most frequent first."""
    counts: dict[str, int] = {}
    for t in trials:
        shown = outcome_text(t)
        counts[shown] = counts.get(shown, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items(), key=lambda kv: -kv[1]))
