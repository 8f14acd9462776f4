"""Fixtures of the export tests: small hand-made studies with a known Pareto front, written through the
same Store the tuner uses, and NVML answered by the simulator. The records and types they build on are in
tests/support/studies.py; the session's real study (`study_db`) is in tests/support/plugin.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.scenario import Scenario
from autotuner.store.db import Store, StudyKey, StudyRecord, TrialRecord
from tests.support.studies import KNOWN_FRONT, REPO, FakeGpus, MakeStudy, StudyDb, key_for


@pytest.fixture
def make_study(tmp_path: Path) -> MakeStudy:
    """A study written straight into a fresh database: scenario overrides, trials, key."""

    def make(trials: list[TrialRecord] | None = None, *, name: str = "known-front",
             engine: dict[str, Any] | None = None, key: StudyKey | None = None, db: str = "known.db",
             created_at: float | None = None) -> StudyDb:
        base = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
        base["engine"].update({"kind": "vllm", "model": "meta-llama/Llama-2-13b-hf", "flags": {}, "sim": {},
                               **(engine or {})})
        scenario = Scenario.model_validate(base)
        storage = str(tmp_path / db)
        store = Store(storage)
        store.save_study(StudyRecord(name, scenario.name, key or key_for(scenario),
                                     json.loads(scenario.model_dump_json()), None, created_at or time.time()))
        for record in KNOWN_FRONT if trials is None else trials:
            store.save_trial(name, record)
        return StudyDb(storage, name, scenario)

    return make


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    """`nvml` answered by the simulator's pynvml-shaped module over a box of simulated GPUs: the seam
    the monitor is built on, so the target check runs its real code against known hardware."""
    from autotuner.monitor import factory
    from autotuner.sim.gpu_state import GpuHost, make_gpus

    real = factory.open_monitor

    def install(name: str, total_bytes: int, count: int) -> None:
        state = tmp_path / f"gpus-{name.replace(' ', '_')}-{count}"
        monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(state))
        GpuHost(state).ensure_inventory(make_gpus(state, name, total_bytes, count))
        monkeypatch.setattr(factory, "open_monitor",
                            lambda kind, gpus, root_pid=None: real("sim" if kind == "nvml" else kind, gpus, root_pid))

    return install
