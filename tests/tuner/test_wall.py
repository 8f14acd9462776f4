"""The memory wall in the loop: candidates the memory model rules out are recorded, never launched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotuner.tuner.memory_model import MemoryModel
from autotuner.tuner.study import OOM_PREDICTED, launched_trials
from tests.tuner.test_study import virtual_tuner


def test_loop_does_not_launch_what_the_model_rules_out(tmp_path: Path) -> None:
    tuner, store = virtual_tuner(tmp_path, 16, seed=0)
    summary = asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    launched = launched_trials(study)
    assert summary.trials_done == len(launched) == 16
    predicted = [t for t in complete if t.user_attrs["outcome"] == OOM_PREDICTED]
    assert predicted, "the quickstart's space reaches past the wall: the model rules candidates out"
    rows = {r.trial_number: r for r in store.trials(tuner.study_name)}
    for t in predicted:
        assert t.user_attrs["launched"] is False and not t.user_attrs["feasible"]
        assert t.user_attrs["predicted:p_over"] >= 0.9
        low, mid, high = (t.user_attrs[f"predicted:{k}"] for k in ("low", "peak_fraction", "high"))
        assert low <= mid <= high
        assert rows[t.number].result["argv"] == [] and rows[t.number].outcome == OOM_PREDICTED
        # The same verdict from the evidence before it, refitted from the stored rows.
        earlier = MemoryModel.for_scenario(tuner.scenario, tuner.rules.defaults(),
                                           [r for n, r in rows.items() if n < t.number])
        assert earlier.screen(rows[t.number].flags) is not None
    assert len(rows) == len(complete)
