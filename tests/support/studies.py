"""Study databases for the export and deploy tests: the quickstart scenario in virtual time (with a secret
in its environment, for the leak checks), hand-made trial records with a known Pareto front, the study key
and the simulated GPUs the target check is run against. They live here, not in tests/export/conftest.py,
because tests/deploy reads the same session study (the `study_db` fixture of tests/support/plugin.py) and
every export test builds its studies from the same records."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotuner.scenario import Scenario
from autotuner.store.db import StudyKey, TrialRecord

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


def confirm_runs(first: int, original: int, runs: list[tuple[float, float]]) -> list[TrialRecord]:
    """Re-measurements of trial `original` (output tok/s, TTFT p95 each), stored as `confirm` trials
    numbered from `first`."""
    out = []
    for i, (thr, ttft) in enumerate(runs):
        t = trial(first + i, thr, ttft, kind="confirm")
        t.result["confirms"] = original
        out.append(t)
    return out


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


MakeStudy = Callable[..., StudyDb]  # the `make_study` fixture (tests/export/conftest.py)

FakeGpus = Callable[[str, int, int], None]  # the `fake_nvml` fixture (tests/export/conftest.py)

RTX_3090 = ("NVIDIA GeForce RTX 3090", 25436943810)  # as the simulator presents it: 23.69 GiB
