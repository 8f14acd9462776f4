"""Early stopping: the rules on partial results, and a hopeless trial on the simulator (a real engine
process over HTTP) stopped before its workload ends with its partial metrics stored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.scenario import load_scenario
from autotuner.stats import percentile
from autotuner.store.db import Store
from autotuner.trials.outcomes import Outcome
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.pruning import Done, FrontPoint, Partial, Pruner, certain_lower_bound
from autotuner.tuner.runners import MeasureRunner
from autotuner.tuner.study import Tuner
from tests.support.quickstart import scenario

OBJECTIVES = [("output_tokens_per_s", "maximize"), ("ttft_p95_s", "minimize")]


def steady(n_done: int, total: int, every_s: float, ttft_s: float, tokens: int = 100) -> Partial:
    done = [Done((i + 1) * every_s, True, tokens, ttft_s, 0.01, ttft_s + 1) for i in range(n_done)]
    return Partial(n_done * every_s, total, done)


def test_certain_bound_never_exceeds_the_final_percentile() -> None:
    ttfts = [0.5, 3.0, 0.7, 9.0, 1.1, 8.0, 0.4, 2.5, 7.5, 0.9, 6.0, 1.0, 0.3, 5.0, 0.8, 4.0]
    final = percentile(ttfts, 95)
    assert final is not None
    for k in range(1, len(ttfts) + 1):
        partial = Partial(float(k), len(ttfts), [Done(float(i), True, 10, t) for i, t in enumerate(ttfts[:k])])
        low = certain_lower_bound(partial, "ttft_p95_s")
        assert low is None or low <= final + 1e-12, (k, low, final)
    assert certain_lower_bound(partial, "ttft_p95_s") is not None


def test_slo_miss_by_a_wide_margin_prunes_and_a_near_miss_does_not() -> None:
    pruner = Pruner({"ttft_p95_s": 2.0}, OBJECTIVES)
    assert pruner.check(steady(3, 20, 1.0, ttft_s=2.2)) is None  # over the SLO, not by the margin
    reason = pruner.check(steady(3, 20, 1.0, ttft_s=5.0))
    assert reason is not None and "ttft_p95_s" in reason
    assert pruner.check(steady(1, 20, 1.0, ttft_s=5.0)) is None  # one slow request bounds nothing yet


def test_front_prunes_only_what_it_dominates_with_enough_evidence() -> None:
    front = [FrontPoint(3, {"output_tokens_per_s": 200.0, "ttft_p95_s": 1.0})]
    pruner = Pruner({"ttft_p95_s": 10.0}, OBJECTIVES, front)
    # 100 tokens per second-long completion = 100 tok/s, TTFT 2 s: dominated by trial 3 on both.
    assert pruner.check(steady(3, 40, 1.0, ttft_s=2.0)) is None, "too few requests to judge"
    reason = pruner.check(steady(12, 40, 1.0, ttft_s=2.0))
    assert reason is not None and "trial 3" in reason
    # As fast as the front: never pruned, whatever the TTFT.
    assert pruner.check(steady(12, 40, 0.4, ttft_s=2.0)) is None
    # Better TTFT than the front: it may join the front.
    assert pruner.check(steady(12, 40, 1.0, ttft_s=0.5)) is None


@pytest.mark.usefixtures("sim_state")
def test_hopeless_trial_on_the_simulator_stops_before_its_workload_ends(tmp_path: Path) -> None:
    # TTFT p95 ≤ 0.2 s on 3000–6000-token prompts at concurrency 8: no configuration meets it.
    sc = load_scenario(scenario(tmp_path, workload__requests__count=24, slos={"ttft_p95_s": 0.2}))
    store = Store(str(tmp_path / "study.db"))
    tuner = Tuner(sc, MeasureRunner(sc, tmp_path / "logs"), store, n_trials=1, seed=0)
    summary = asyncio.run(tuner.run())
    assert summary.trials_done == 1
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    [trial] = launched_trials(study)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["outcome"] == Outcome.PRUNED
    assert not trial.user_attrs["feasible"] and trial.user_attrs["constraints"]["slo"] > 0
    [row] = store.trials(tuner.study_name)
    assert row.outcome == Outcome.PRUNED and "ttft_p95_s" in (row.reason or "")
    m = row.result["metrics"]
    assert m["partial_of"] == 24 and 1 <= m["completed"] < 24, m
    assert m["ttft_p95_s"] is not None and m["ttft_p95_s"] > 0.2
    assert m["failed"] == 0, "requests cut short by the stop are not the configuration's failures"
    assert Path(row.result["engine"]["log_path"]).is_file(), "an engine ran: a pruned trial is an engine run"
