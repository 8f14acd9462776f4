"""Study databases for the export tests: one real study (the real Tuner loop over the simulator's engine
core in virtual time, built once per session) and small hand-made studies with a known Pareto front,
written through the same Store the tuner uses."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.scenario import Scenario, load_scenario
from autotuner.store.db import Store, StudyKey, StudyRecord, TrialRecord
from autotuner.tuner.runner import VirtualRunner
from autotuner.tuner.study import Tuner

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_do_not_leak_0123456789"
GIB = 1 << 30
TOTAL = int(23.69 * GIB)


@dataclass
class StudyDb:
    storage: str
    name: str
    scenario: Scenario


def quickstart_virtual(tmp: Path, **engine: Any) -> Path:
    """The quickstart scenario in virtual time, with a secret in its environment and an API key."""
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["kind"] = "sim-virtual"
    data["engine"]["env"]["HF_TOKEN"] = SECRET
    data["engine"]["api_key_env"] = "MY_SERVICE_KEY"
    data["engine"].update(engine)
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> StudyDb:
    tmp = tmp_path_factory.mktemp("study")
    scenario = load_scenario(quickstart_virtual(tmp))
    store = Store(str(tmp / "study.db"))
    tuner = Tuner(scenario, VirtualRunner(scenario), store, n_trials=14, seed=0)
    summary = asyncio.run(tuner.run())
    assert summary.best, "the fixture study needs at least one feasible trial"
    return StudyDb(str(tmp / "study.db"), summary.study_name, scenario)


def trial(number: int, thr: float | None, ttft: float | None, *, kind: str = "search", outcome: str = "ok",
          peak: float = 0.8, failed: int = 0, reason: str | None = None,
          flags: dict[str, Any] | None = None, timeline: list[Any] | None = None) -> TrialRecord:
    metrics = {} if thr is None else {
        "output_tokens_per_s": thr, "total_tokens_per_s": thr * 30, "requests_per_s": thr / 100,
        "ttft_p50_s": ttft and ttft / 2, "ttft_p95_s": ttft, "tpot_p50_s": 0.05, "e2e_p95_s": (ttft or 0) + 6,
        "completed": 16 - failed, "failed": failed}
    peak_bytes = int(peak * TOTAL)
    result = {"outcome": outcome, "reason": reason, "metrics": metrics, "time_scale": 1.0,
              "memory": {"peak_bytes": [peak_bytes, peak_bytes - GIB // 4], "total_bytes": [TOTAL, TOTAL],
                         "peak_fraction": peak, "devices": [0, 1]},
              "engine": {"version": "0.32.0", "kv_cache_tokens": 100000 + number, "preemptions": 0}}
    return TrialRecord(number, kind, outcome, reason, "COMPLETE",
                       flags or {"tensor-parallel-size": 2, "max-num-batched-tokens": 512 * (number + 1),
                                 "gpu-memory-utilization": 0.8, "enable-prefix-caching": number % 2 == 0},
                       result, timeline or [], [], time.time(), time.time())


# A known front (objectives: max output tok/s, min TTFT p95; scenario SLO ttft_p95 ≤ 10 s):
#   1 (100, 9 s) best throughput · 2 (90, 4 s) the knee · 3 (50, 1 s) best TTFT · 4 dominated by 2;
#   5 misses the scenario SLO, 6 lost requests, 7 ran above the OOM threshold, 0 the OOM'd baseline.
KNOWN_FRONT = [
    trial(0, None, None, kind="baseline", outcome="oom-threshold", peak=0.99, reason="GPU 0 reached 23.4 GiB"),
    trial(1, 100.0, 9.0), trial(2, 90.0, 4.0), trial(3, 50.0, 1.0), trial(4, 60.0, 5.0),
    trial(5, 200.0, 30.0), trial(6, 120.0, 2.0, failed=5), trial(7, 150.0, 3.0, peak=0.98),
]


def key_for(scenario: Scenario, inventory: list[str] | None = None, fingerprint: str = "f" * 16) -> StudyKey:
    return StudyKey(fingerprint, inventory or ["NVIDIA GeForce RTX 3090 (23.69 GiB)"] * 2, "0.32.0", "w" * 16)


MakeStudy = Callable[..., StudyDb]


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


FakeGpus = Callable[[str, int, int], None]


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


RTX_3090 = ("NVIDIA GeForce RTX 3090", 25436943810)  # as the simulator presents it: 23.69 GiB
