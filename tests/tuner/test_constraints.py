"""One OOM threshold decides everywhere: `min_free_mib` counts in the study's constraints and in the
export's feasibility, exactly as the sampler applies it."""

from __future__ import annotations

import time

import pytest

from autotuner.analysis.candidates import infeasible_reason
from autotuner.scenario import Scenario
from autotuner.store.db import TrialRecord
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import constraints_of, feasible, threshold_of

GIB = 2**30
MIB = 2**20
TOTAL = 24 * GIB


def scenario(**threshold: float) -> Scenario:
    return Scenario.model_validate({"engine": {"kind": "sim", "model": "llama-2-7b"}, "oom_threshold": threshold})


def result(peak_bytes: int, outcome: str = Outcome.OK) -> TrialResult:
    return TrialResult(outcome, None, {}, [], metrics={"completed": 8, "failed": 0, "output_tokens_per_s": 100.0,
                                                        "ttft_p95_s": 1.0},
                       memory={"peak_bytes": [peak_bytes, GIB], "total_bytes": [TOTAL, TOTAL],
                               "peak_fraction": peak_bytes / TOTAL})


# 95 % of the card: under the default 97 % threshold, but only 1.2 GiB free — less than 2048 MiB.
PEAK = int(TOTAL * 0.95)


def test_min_free_mib_is_the_threshold_of_the_constraints() -> None:
    assert feasible(constraints_of(result(PEAK), scenario()))
    tight = scenario(min_free_mib=2048)
    c = constraints_of(result(PEAK), tight)
    assert not feasible(c)
    limit = threshold_of(tight).limit_bytes(TOTAL)
    assert c["memory"] == pytest.approx((PEAK - limit) / TOTAL)
    # Under the wall by 1 GiB more than asked: feasible, with the margin as the constraint's value.
    roomy = TOTAL - 3 * 1024 * MIB
    assert constraints_of(result(roomy), tight)["memory"] == pytest.approx(-1024 * MIB / TOTAL)


def test_a_cuda_oom_is_past_a_min_free_threshold_too() -> None:
    c = constraints_of(result(GIB, outcome=Outcome.OOM_CRASH), scenario(min_free_mib=2048))
    assert c["memory"] > 2048 * MIB / TOTAL


def test_export_feasibility_uses_min_free_mib() -> None:
    r = result(PEAK)
    record = TrialRecord(1, "search", Outcome.OK, None, "COMPLETE", {}, {"metrics": r.metrics, "memory": r.memory},
                         started_at=time.time(), finished_at=time.time())
    assert infeasible_reason(record, scenario()) is None
    why = infeasible_reason(record, scenario(min_free_mib=2048))
    assert why is not None and "leaves under 2048 MiB free" in why
