"""Each trigger fires on its evidence and only then: production's identity against the reference, its own
recent past, the clock. Snapshots are built as watch/ returns them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

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


def served_snap(at: float, requests: float, **changes: object) -> ProductionSnapshot:
    """A snapshot `requests` finished requests into the engine's life, each 48 tokens out, TTFT 0.3 s."""
    ttft = LengthHistogram(((0.25, 0.0), (0.5, requests), (float("inf"), requests)), requests, 0.3 * requests)
    itl = LengthHistogram(((0.025, 0.0), (0.05, 47 * requests), (float("inf"), 47 * requests)), 47 * requests,
                          0.035 * 47 * requests)
    gen = LengthHistogram(((20.0, 0.0), (50.0, requests), (float("inf"), requests)), requests, 48.0 * requests)
    return snap(taken_at=at, prompt_tokens=hist([0, 0, requests, 0, 0, 0]), generation_tokens=gen, ttft_s=ttft,
                itl_s=itl, **changes)


def test_the_served_window_spans_one_lifetime_and_none_of_our_own_traffic() -> None:
    watch = TriggerWatch(TriggerSettings(workload_drift=None))
    ref = identity(snap(), GPUS)
    for at, n in ((100.0, 10), (200.0, 40), (300.0, 70)):
        watch.observe(served_snap(at, n), GPUS, ref, SC, None, now=at)
    window = watch.served_window()
    assert window is not None
    assert (window.start, window.end, window.requests) == (100.0, 300.0, 60)
    assert window.request_rate == pytest.approx(0.3) and window.output_tokens_per_s == pytest.approx(0.3 * 48)
    assert window.ttft_s.quantile(0.5) is not None and 0.25 < window.ttft_s.quantile(0.5) <= 0.5
    # The daemon's own verify prompts until 350 s: no window may hold them.
    watch.own_traffic(310.0, 350.0)
    assert watch.served_window() is None
    watch.observe(served_snap(350.5, 80), GPUS, ref, SC, None, now=350.5)  # not settled yet: skipped
    for at, n in ((400.0, 90), (500.0, 120)):
        watch.observe(served_snap(at, n), GPUS, ref, SC, None, now=at)
    window = watch.served_window()
    assert window is not None and (window.start, window.requests) == (400.0, 30)
    # The engine restarted (its counters began again): the window starts with the new lifetime.
    watch.observe(served_snap(600.0, 5), GPUS, ref, SC, None, now=600.0)
    assert watch.served_window() is None
    watch.observe(served_snap(700.0, 45), GPUS, ref, SC, None, now=700.0)
    window = watch.served_window()
    assert window is not None and (window.start, window.requests) == (600.0, 40)
    # Older snapshots than the window's reach are dropped; too few requests make no window.
    watch.observe(served_snap(700.0 + 2000, 50), GPUS, ref, SC, None, now=2700.0)
    assert watch.served_window() is None
    # After a cycle changed production, its past is another config's.
    watch.observe(served_snap(2800.0, 90), GPUS, ref, SC, None, now=2800.0)
    assert watch.served_window() is not None
    watch.forget()
    assert watch.served_window() is None


def test_the_served_evidence_keeps_only_the_tuned_flags_and_survives_json() -> None:
    import json

    from autotuner.daemon.evidence import SERVED, served_evidence, twin_evidence
    from autotuner.watch.served import served_window

    window = served_window(served_snap(0.0, 0), served_snap(100.0, 50))
    assert window is not None
    live = {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.9, "api-key": "s3cret", "port": 8000}
    evidence = json.loads(json.dumps(served_evidence(window, live, SC)))
    assert evidence[SERVED]["flags"] == {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.9}
    assert "s3cret" not in json.dumps(evidence)
    assert served_evidence(None, live, SC) == {} and served_evidence(window, None, SC) == {}
    obs = twin_evidence(SC, evidence)
    assert len(obs) == 1 and obs[0].flags == evidence[SERVED]["flags"]
    assert obs[0].workload is not None and obs[0].workload["arrivals"] == {"kind": "poisson", "rate": 0.5}
    # Production served another model than the cycle tunes: nothing to calibrate on.
    other = SC.model_copy(update={"engine": SC.engine.model_copy(update={"model": "mistral-7b"})})
    assert twin_evidence(other, evidence) == []
