"""The memory wall in the loop: candidates the memory model rules out are recorded, never launched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.scenario import load_scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import Outcome
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.memory_model import MemoryModel
from autotuner.tuner.runners import MeasureRunner
from autotuner.tuner.study import Tuner
from tests.support.quickstart import scenario, virtual_tuner


def test_loop_does_not_launch_what_the_model_rules_out(tmp_path: Path) -> None:
    tuner, store = virtual_tuner(tmp_path, 16, seed=0)
    summary = asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    launched = launched_trials(study)
    assert summary.trials_done == len(launched) == 16
    predicted = [t for t in complete if t.user_attrs["outcome"] == Outcome.OOM_PREDICTED]
    assert predicted, "the quickstart's space reaches past the wall: the model rules candidates out"
    rows = {r.trial_number: r for r in store.trials(tuner.study_name)}
    for t in predicted:
        assert t.user_attrs["launched"] is False and not t.user_attrs["feasible"]
        assert t.user_attrs["predicted:p_over"] >= 0.9
        low, mid, high = (t.user_attrs[f"predicted:{k}"] for k in ("low", "peak_fraction", "high"))
        assert low <= mid <= high
        assert rows[t.number].result["argv"] == [] and rows[t.number].outcome == Outcome.OOM_PREDICTED
        # The same verdict from the evidence before it, refitted from the stored rows.
        earlier = MemoryModel.for_scenario(tuner.scenario, tuner.rules.defaults(),
                                           [r for n, r in rows.items() if n < t.number])
        assert earlier.screen(rows[t.number].flags) is not None
    assert len(rows) == len(complete)


@pytest.mark.usefixtures("sim_state")
def test_ruled_out_candidates_launch_no_engine_on_the_simulator(tmp_path: Path) -> None:
    """Real engine processes: every launched trial left an engine log; the ruled-out ones none."""
    space = {"max-num-batched-tokens": {"type": "int", "low": 2048, "high": 16384, "log": True},
             "gpu-memory-utilization": {"type": "float", "low": 0.90, "high": 0.95, "step": 0.01}}
    sc = load_scenario(scenario(tmp_path, search_space=space, workload__requests__count=6))
    store = Store(str(tmp_path / "study.db"))
    logs = tmp_path / "logs"
    tuner = Tuner(sc, MeasureRunner(sc, logs), store, n_trials=4, seed=0)
    summary = asyncio.run(tuner.run())
    assert summary.trials_done == 4
    rows = store.trials(tuner.study_name)
    predicted = [r for r in rows if r.outcome == Outcome.OOM_PREDICTED]
    launched = [r for r in rows if r.outcome != Outcome.OOM_PREDICTED]
    assert predicted, [(r.kind, r.outcome, r.flags) for r in rows]
    engine_logs = sorted(logs.glob("engine-*.log"))
    assert len(engine_logs) == len(launched) == 4
    assert {Path(r.result["engine"]["log_path"]) for r in launched} == set(engine_logs)
    for r in predicted:
        assert r.result["argv"] == [] and not r.result["engine"].get("log_path")
        assert r.started_at >= rows[0].started_at
