"""Each trigger fires on its evidence and only then: production's identity against the reference, its own
recent past, the clock. Snapshots are built as watch/ returns them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotuner.daemon.config import DriftSettings, ScheduleSettings, TriggerSettings
from autotuner.daemon.evidence import observed_prompts, tune_changes
from autotuner.daemon.triggers import (
    CRASH,
    DRIFT,
    ENGINE_UPGRADE,
    GPU_CHANGE,
    KV_PRESSURE,
    MODEL_SWAP,
    OOM,
    SCHEDULE,
    TriggerWatch,
    histogram_dict,
    histogram_of,
    identity,
)
from autotuner.scenario import Scenario
from autotuner.watch.snapshot import GpuInfo, LengthHistogram, ProductionSnapshot
from tests.support.daemon import SCENARIO

BOUNDS = (100.0, 500.0, 1000.0, 2000.0, 5000.0, float("inf"))
GPUS = (GpuInfo(0, "GPU-aaaa", "NVIDIA GeForce RTX 4090", 24564),)
SC = Scenario.model_validate(SCENARIO)  # prompts uniform 500-3000: p95 = 2875


def hist(per_bucket: list[float]) -> LengthHistogram:
    cumulative, total = [], 0.0
    for n in per_bucket:
        total += n
        cumulative.append(total)
    mids = [50, 300, 750, 1500, 3500, 6000]
    return LengthHistogram(tuple(zip(BOUNDS, cumulative, strict=True)), total,
                           sum(n * m for n, m in zip(per_bucket, mids, strict=True)))


def snap(**changes: object) -> ProductionSnapshot:
    base = ProductionSnapshot(taken_at=0.0, endpoint="http://127.0.0.1:8000", reachable=True, error=None,
                              served_model="llama-2-7b", root="llama-2-7b", max_model_len=4096, vllm_version="0.32.0",
                              model_fingerprint="llama-2-7b", prompt_tokens=hist([0, 10, 10, 10, 0, 0]),
                              generation_tokens=None, kv_cache_usage=0.5, preemptions_total=0.0, requests_running=1.0)
    return replace(base, **changes)  # type: ignore[arg-type]


def kinds(fired: list) -> list[str]:
    return [t.kind for t in fired]


def test_identity_changes_fire_swap_upgrade_and_gpu_change() -> None:
    watch = TriggerWatch(TriggerSettings(workload_drift=None))
    ref = identity(snap(), GPUS)
    assert watch.observe(snap(), GPUS, ref, SC, None) == []
    swapped = watch.observe(snap(model_fingerprint="mistral-7b", root="mistral-7b"), GPUS, ref, SC, None)
    assert kinds(swapped) == [MODEL_SWAP]
    assert swapped[0].evidence["before"] == "llama-2-7b" and swapped[0].evidence["root"] == "mistral-7b"
    assert kinds(watch.observe(snap(vllm_version="0.33.1"), GPUS, ref, SC, None)) == [ENGINE_UPGRADE]
    other = (GpuInfo(0, "GPU-bbbb", "NVIDIA GeForce RTX 4090", 24564),)
    assert kinds(watch.observe(snap(), other, ref, SC, None)) == [GPU_CHANGE]
    # Switched off: nothing.
    off = TriggerWatch(TriggerSettings(model_swap=False, engine_upgrade=False, gpu_change=False, workload_drift=None))
    assert off.observe(snap(model_fingerprint="x", vllm_version="9"), other, ref, SC, None) == []


def test_oom_lines_in_the_log_fire_once_with_the_lengths_seen_before(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("old line: torch.OutOfMemoryError: CUDA out of memory. before the daemon started\n")
    watch = TriggerWatch(TriggerSettings(workload_drift=None), log)
    ref = identity(snap(), GPUS)
    assert watch.observe(snap(), GPUS, ref, SC, None) == []  # OOMs before we started are not news
    with log.open("a") as f:
        f.write("(EngineCore pid=1) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    fired = watch.observe(snap(reachable=False, error="refused"), GPUS, ref, SC, None)
    assert kinds(fired) == [OOM]
    assert fired[0].evidence["count"] == 1 and histogram_of(fired[0].evidence["prompt_tokens"]).count == 30
    assert watch.observe(snap(reachable=False), GPUS, ref, SC, None) == []


def test_a_crash_is_production_down_longer_than_an_engine_start() -> None:
    watch = TriggerWatch(TriggerSettings(workload_drift=None))
    ref = identity(snap(), GPUS)
    grace = SC.engine.startup_timeout_s
    watch.observe(snap(), GPUS, ref, SC, None, now=0.0)
    assert watch.observe(snap(reachable=False), GPUS, ref, SC, None, now=1.0) == []  # a restart by a person
    assert watch.observe(snap(reachable=False), GPUS, ref, SC, None, now=grace / 2) == []
    fired = watch.observe(snap(reachable=False, error="refused"), GPUS, ref, SC, None, now=1.0 + grace)
    assert kinds(fired) == [CRASH] and fired[0].evidence["error"] == "refused"
    assert watch.observe(snap(reachable=False), GPUS, ref, SC, None, now=2.0 + grace) == []  # once
    # A restart between two polls: the request counters went back.
    watch.observe(snap(), GPUS, ref, SC, None, now=3.0 + grace)
    restarted = watch.observe(snap(prompt_tokens=hist([0, 1, 0, 0, 0, 0])), GPUS, ref, SC, None, now=4.0 + grace)
    assert kinds(restarted) == [CRASH] and "restarted" in restarted[0].evidence["error"]


def test_kv_pinned_with_preemptions_climbing_fires_after_three_polls() -> None:
    watch = TriggerWatch(TriggerSettings(workload_drift=None))
    ref = identity(snap(), GPUS)
    results = [kinds(watch.observe(snap(kv_cache_usage=0.99, preemptions_total=float(n)), GPUS, ref, SC, None))
               for n in range(5)]
    assert results == [[], [], [], [KV_PRESSURE], []]
    calm = TriggerWatch(TriggerSettings(workload_drift=None))
    assert all(calm.observe(snap(kv_cache_usage=0.99, preemptions_total=5.0), GPUS, ref, SC, None) == []
               for _ in range(5))


def test_drift_over_the_sliding_window_and_the_schedule() -> None:
    settings = TriggerSettings(workload_drift=DriftSettings(p95_ratio=1.25, window_s=100, min_requests=20))
    watch = TriggerWatch(settings)
    ref = identity(snap(), GPUS)
    start = hist([0, 10, 10, 10, 0, 0])
    assert watch.observe(snap(prompt_tokens=start), GPUS, ref, SC, None, now=0.0) == []
    # 30 more requests, all above 5000 tokens on an 8192 context: p95 ≈ 8000 against the scenario's 2875.
    later = hist([0, 10, 10, 10, 0, 30])
    fired = watch.observe(snap(prompt_tokens=later, max_model_len=8192), GPUS, ref, SC, None, now=50.0)
    assert kinds(fired) == [DRIFT]
    assert fired[0].evidence["requests"] == 30 and fired[0].evidence["ratio"] > 1.25
    # The window carries the lengths the re-tune uses: from its median to its longest, cut to what the
    # scenario's 4096 context holds beside its 32 output tokens and the margin.
    assert tune_changes(SC, DRIFT, fired[0].evidence) == {
        "workload.requests.prompt_tokens": {"kind": "uniform", "low": 4048, "high": 4048}}
    # After a swap, every later cycle tunes the model production serves, not the scenario's.
    assert tune_changes(SC, SCHEDULE, {}, {"root": "mistral-7b"}) == {"engine.model": "mistral-7b"}
    assert tune_changes(SC, SCHEDULE, {}, {"root": "llama-2-7b"}) == {}
    # Too few new requests in the window: nothing.
    quiet = TriggerWatch(settings)
    quiet.observe(snap(prompt_tokens=start), GPUS, ref, SC, None, now=0.0)
    assert quiet.observe(snap(prompt_tokens=hist([0, 10, 10, 10, 5, 0])), GPUS, ref, SC, None, now=50.0) == []
    sched = TriggerWatch(TriggerSettings(workload_drift=None, schedule=ScheduleSettings(every=3600)))
    assert sched.observe(snap(), GPUS, ref, SC, last_cycle_at=1000.0, now=2000.0) == []
    assert kinds(sched.observe(snap(), GPUS, ref, SC, last_cycle_at=1000.0, now=4600.0)) == [SCHEDULE]


def test_observed_lengths_survive_json_and_fit_the_context() -> None:
    h = hist([0, 0, 0, 0, 0, 4])  # all longer than the largest finite bound
    assert histogram_of(histogram_dict(h)) == h
    assert observed_prompts(SC, {"prompt_tokens": histogram_dict(hist([0, 0, 0, 4, 0, 0]))}) == {
        "kind": "uniform", "low": 1500, "high": 2000}
    assert observed_prompts(SC, {"prompt_tokens": None}) is None
