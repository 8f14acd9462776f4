"""The trials layer's promises: outcomes and kinds are the very strings stored before they had names,
and a trial result's record is the same whatever type its outcome has."""

from __future__ import annotations

import json

from autotuner.trials.outcomes import SCREENED, TRUST_KINDS, Outcome, TrialKind
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import counts_against_budget

STORED_OUTCOMES = {"ok", "oom-threshold", "oom-crash", "startup-failed", "invalid-flags", "timeout", "crash",
                   "monitor-failed", "interference", "oom-predicted", "pruned", "interrupted", "gpus-busy"}
STORED_KINDS = {"baseline", "current", "warm-start", "search", "repaired", "probe", "twin", "confirm", "soak",
                "backoff"}


def test_outcomes_and_kinds_are_the_stored_strings() -> None:
    assert {o.value for o in Outcome} == STORED_OUTCOMES
    assert {k.value for k in TrialKind} == STORED_KINDS
    assert Outcome.OOM_PREDICTED == "oom-predicted" and f"{Outcome.PRUNED}" == "pruned"
    assert "confirm" in TRUST_KINDS and "search" in SCREENED and "baseline" not in SCREENED


def test_a_result_serialises_the_same_with_an_enum_or_a_string_outcome() -> None:
    def record(outcome: str) -> str:
        result = TrialResult(outcome, None, {"max-num-batched-tokens": 2048}, [],  # type: ignore[arg-type]
                             metrics={"completed": 9, "failed": 1}, memory={"peak_fraction": 0.9})
        return json.dumps(result.to_dict(), sort_keys=True)

    assert record(Outcome.OK) == record("ok")
    result = TrialResult(Outcome.OK, None, {}, [], metrics={"completed": 9, "failed": 1}, memory={"peak_fraction": 1})
    assert result.failed_share == 0.1 and result.peak_fraction == 1 and result.metric("ttft_p95_s") is None
    assert "failed_share" not in result.to_dict() and "peak_fraction" not in result.to_dict()


def test_the_budget_counts_launched_search_trials_only() -> None:
    assert counts_against_budget({"kind": "search"})  # older rows have no "launched"
    assert not counts_against_budget({"kind": "search", "launched": False})
    assert not counts_against_budget({"kind": TrialKind.CONFIRM, "launched": True})
    assert not counts_against_budget({"kind": TrialKind.BACKOFF, "launched": True})  # the trust phase's
