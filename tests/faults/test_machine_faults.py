"""Faults of the machine, not of the candidate, injected into the simulated box mid-trial: the NVML
driver failing (GPU lost, unknown error), another process taking memory on our GPUs. The attempt is
classified as the machine's, its engine stopped, and the trial re-run; the study records it once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from autotuner.engine.registry import EngineRegistry
from autotuner.scenario import load_scenario
from autotuner.sim.gpu_state import clear_nvml_fault, inject_nvml_fault
from autotuner.store.db import Store
from autotuner.trials.result import Phase, TrialResult
from autotuner.tuner.pruning import Pruner
from autotuner.tuner.runners import MeasureRunner
from autotuner.tuner.study import Tuner
from autotuner.vllm import FlagValue
from tests.support.faults import assert_engine_gone, registry_empty, sim_scenario


class RecordingRunner(MeasureRunner):
    """The real runner; keeps every attempt's result, the retried ones too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempts: list[TrialResult] = []

    async def run(self, flags: Mapping[str, FlagValue], on_phase: Phase | None = None, *,
                  gpus: Sequence[int] | None = None, pruner: Pruner | None = None) -> TrialResult:
        result = await super().run(flags, on_phase, gpus=gpus, pruner=pruner)
        self.attempts.append(result)
        return result


def _tune_once(tmp_path: Path, on_phase: Any) -> tuple[RecordingRunner, Store, Tuner]:
    sc = load_scenario(sim_scenario(tmp_path))
    runner = RecordingRunner(sc, tmp_path / "logs", EngineRegistry())
    store = Store(str(tmp_path / "study.db"))

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "phase":
            on_phase(data["phase"])

    tuner = Tuner(sc, runner, store, n_trials=1, seed=0, on_event=on_event)
    asyncio.run(tuner.run())
    return runner, store, tuner


def _assert_rerun(runner: RecordingRunner, store: Store, tuner: Tuner, home: Path) -> None:
    assert len(runner.attempts) == 2, [a.outcome for a in runner.attempts]
    assert runner.attempts[1].outcome == "ok", runner.attempts[1].reason
    for attempt in runner.attempts:
        assert_engine_gone(attempt.engine["log_path"])
    assert registry_empty(home)
    rows = store.trials(tuner.study_name)
    assert [(r.trial_number, r.outcome, r.state) for r in rows] == [(0, "ok", "COMPLETE")]


@pytest.mark.parametrize(("code", "said"), [(15, "GPU is lost"), (999, "Unknown Error")])
def test_nvml_error_mid_trial_is_a_machine_fault_and_the_trial_is_rerun(
        home: Path, tmp_path: Path, sim_state: Path, code: int, said: str) -> None:
    seen: list[str] = []
    injected: list[int] = []

    def on_phase(phase: str) -> None:
        seen.append(phase)
        if phase == "replay" and seen.count("replay") == 1:
            inject_nvml_fault(sim_state, code)  # the driver starts failing under the first attempt
            injected.append(code)
        elif phase == "stopping" and injected:
            clear_nvml_fault(sim_state)  # and recovers before the retry
            injected.clear()

    runner, store, tuner = _tune_once(tmp_path, on_phase)
    first = runner.attempts[0]
    assert first.outcome == "monitor-failed", (first.outcome, first.reason)
    assert first.infrastructure and said in (first.reason or "")
    _assert_rerun(runner, store, tuner, home)


def test_foreign_memory_mid_trial_is_named_not_blamed_and_the_trial_is_rerun(
        home: Path, tmp_path: Path, sim_state: Path) -> None:
    holder: list[subprocess.Popen[bytes]] = []

    def on_phase(phase: str) -> None:
        if phase == "replay" and not holder:
            # Another user's job takes 3 GiB on one of our GPUs while our engine serves.
            holder.append(subprocess.Popen([sys.executable, "-m", "autotuner", "sim", "hold", "--gpu", "2",
                                            "--mib", "3000", "--name", "someone-else"],
                                           stdout=subprocess.PIPE, start_new_session=True))
            assert holder[0].stdout is not None
            holder[0].stdout.readline()  # "holding ... MiB": the memory is held now
        elif phase == "stopping" and holder and holder[0].poll() is None:
            os.kill(holder[0].pid, signal.SIGTERM)  # that job ends before the retry
            holder[0].wait(timeout=10)

    try:
        runner, store, tuner = _tune_once(tmp_path, on_phase)
    finally:
        for proc in holder:
            if proc.poll() is None:
                proc.kill()
    first = runner.attempts[0]
    assert first.outcome == "interference", (first.outcome, first.reason)
    assert first.infrastructure
    assert f"pid {holder[0].pid}" in (first.reason or ""), first.reason
    assert "GPU 2" in (first.reason or "") and "not the candidate's fault" in (first.reason or "")
    _assert_rerun(runner, store, tuner, home)
