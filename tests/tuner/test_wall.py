"""The memory wall: candidates at least as large as one that ran out of memory are not launched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotuner.tuner.study import OOM_PREDICTED, launched_trials
from autotuner.tuner.wall import MemoryWall
from tests.tuner.test_study import virtual_tuner

OOM = {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.85, "cpu-offload-gb": 1.0}


def test_dominance_follows_how_memory_grows() -> None:
    wall = MemoryWall()
    wall.add(7, OOM)
    bigger = {"max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.9, "cpu-offload-gb": 0.5}
    assert wall.dominating(bigger).trial_number == 7  # type: ignore[union-attr]
    assert wall.dominating(OOM) is not None
    for smaller in ({**OOM, "max-num-batched-tokens": 2048}, {**OOM, "gpu-memory-utilization": 0.8},
                    {**OOM, "cpu-offload-gb": 2.0}):
        assert wall.dominating(smaller) is None
    assert wall.dominating({**OOM, "enable-prefix-caching": False}) is None  # another flag set: unknown


def test_loop_does_not_launch_what_the_wall_rules_out(tmp_path: Path) -> None:
    tuner, store = virtual_tuner(tmp_path, 16, seed=0)  # a seed whose study meets the wall early
    summary = asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    launched = launched_trials(study)
    assert summary.trials_done == len(launched) == 16
    ooms = [t for t in launched if t.user_attrs["outcome"] in ("oom-threshold", "oom-crash")]
    predicted = [t for t in complete if t.user_attrs["outcome"] == OOM_PREDICTED]
    assert ooms and predicted, "this seed's study meets the wall and then rules candidates out by it"
    for t in predicted:
        assert t.user_attrs["launched"] is False and not t.user_attrs["feasible"]
        earlier = MemoryWall()
        for o in ooms:
            if o.number < t.number:
                earlier.add(o.number, o.params)
        assert earlier.dominating(t.params) is not None
    rows = {r.trial_number: r for r in store.trials(tuner.study_name)}
    assert len(rows) == len(complete)
