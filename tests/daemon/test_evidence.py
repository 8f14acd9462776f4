"""Evidence from production, not from the histogram's edges: long prompts in vLLM's +Inf bucket fire drift
and are replayed at their lengths, the daemon's own verify prompts are not drift, and the prompts of the
step that crashed production (vLLM's scheduler dump) are replayed first by the re-tune and its soak."""

from __future__ import annotations

import math
import random
from pathlib import Path

from autotuner.daemon.config import DriftSettings, TriggerSettings
from autotuner.daemon.cycle_context import apply_changes
from autotuner.daemon.evidence import observed_prompts, tune_changes
from autotuner.daemon.triggers import CRASH, DRIFT, OOM, TriggerWatch, histogram_dict, identity
from autotuner.scenario import Scenario
from autotuner.trust.soak import soak_scenario
from autotuner.vllm.metrics import build_1_2_5_buckets
from autotuner.watch.snapshot import GpuInfo, LengthHistogram, ProductionSnapshot
from tests.support.daemon import SCENARIO
from tests.watch.test_scheduler_dump import LINE
from tests.watch.test_scheduler_dump import OOM as OOM_LINE

GPUS = (GpuInfo(0, "GPU-aaaa", "NVIDIA GeForce RTX 3090", 24576),)
CONTEXT = 8192
# The scenario production was tuned for: an 8192 context, prompts whose p95 is 4095 (as init writes one).
TUNED = Scenario.model_validate({
    **SCENARIO, "engine": {**SCENARIO["engine"], "flags": {"max-model-len": CONTEXT}},
    "workload": {**SCENARIO["workload"], "requests": {**SCENARIO["workload"]["requests"],
                                                      "prompt_tokens": {"kind": "fixed", "value": 4095},
                                                      "output_tokens": 256}}})
SETTINGS = TriggerSettings(workload_drift=DriftSettings(p95_ratio=1.25, window_s=3600, min_requests=200))


def histogram(lengths: list[int], bounds: tuple[float, ...] | None = None) -> LengthHistogram:
    """As vLLM exposes vllm:request_prompt_tokens for an 8192 context: 1-2-5 buckets up to 5000, then +Inf."""
    edges = (*(bounds or build_1_2_5_buckets(CONTEXT)), math.inf)
    return LengthHistogram(tuple((float(le), float(sum(n <= le for n in lengths))) for le in edges),
                           float(len(lengths)), float(sum(lengths)))


def snap(lengths: list[int], **changes: object) -> ProductionSnapshot:
    fields: dict[str, object] = {
        "taken_at": 0.0, "endpoint": "http://127.0.0.1:8000", "reachable": True, "error": None,
        "served_model": "llama-2-7b", "root": "llama-2-7b", "max_model_len": CONTEXT, "vllm_version": "0.32.0",
        "model_fingerprint": "llama-2-7b", "prompt_tokens": histogram(lengths), "generation_tokens": None,
        "kv_cache_usage": 0.5, "preemptions_total": 0.0, "requests_running": 1.0}
    return ProductionSnapshot(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_inf_bucket_is_bounded_by_the_served_context() -> None:
    h = histogram([6000] * 10)  # all ten above the last finite bound, 5000
    assert h.quantile(0.5) == 5000  # PromQL's answer, kept without a bound
    assert h.quantile(0.5, upper=CONTEXT) == 5000 + (CONTEXT - 5000) * 0.5
    assert h.quantile(1.0, upper=CONTEXT) == CONTEXT
    mixed = histogram([1500] * 10 + [7000] * 10)
    assert mixed.quantile(0.25, upper=CONTEXT) == mixed.quantile(0.25)  # finite buckets are unchanged
    assert mixed.quantile(0.95, upper=CONTEXT) == 5000 + (CONTEXT - 5000) * 0.9


def test_long_prompts_fire_drift_and_are_replayed_at_their_lengths() -> None:
    rng = random.Random(7)
    before = [rng.randint(2500, 4095) for _ in range(300)]
    long = [rng.randint(5500, 7800) for _ in range(300)]
    watch = TriggerWatch(SETTINGS)
    ref = identity(snap(before), GPUS)
    assert watch.observe(snap(before), GPUS, ref, TUNED, None, now=0.0) == []
    fired = watch.observe(snap(before + long), GPUS, ref, TUNED, None, now=600.0)
    assert [t.kind for t in fired] == [DRIFT]
    evidence = fired[0].evidence
    assert evidence["requests"] == 300 and evidence["max_model_len"] == CONTEXT
    assert evidence["ratio"] >= 1.25 and evidence["p95_production"] > 7500  # not 5000
    changes = tune_changes(TUNED, DRIFT, evidence, ref)
    prompts = changes["workload.requests.prompt_tokens"]
    # Up to what the context holds beside the 256 output tokens (and the margin), not 3928-5000.
    assert prompts == {"kind": "uniform", "low": 6596, "high": CONTEXT - 256 - 16}
    assert prompts["high"] >= 7800 and prompts["low"] > 5000
    # Without a served context in the evidence, the reference identity's (the `observed` of a cycle).
    assert observed_prompts(TUNED, {"prompt_tokens": evidence["prompt_tokens"]}, ref) == prompts


def test_the_daemons_verify_traffic_is_not_drift() -> None:
    # Prompts 500-3000 (p95 2875) on an 8192 context; the verify after a re-tune for long prompts sends 7000s.
    sc = Scenario.model_validate({**SCENARIO, "engine": {**SCENARIO["engine"], "flags": {"max-model-len": CONTEXT}}})
    settings = TriggerSettings(workload_drift=DriftSettings(p95_ratio=1.25, window_s=3600, min_requests=20))
    prod = [1000] * 40
    verify = [7000] * 50  # ~50 prompts of the tuned scenario's longest a verify sends
    ctx = {"max_model_len": CONTEXT}
    # After a deploy the engine restarted: its counters begin with our verify, then production's traffic.
    watch = TriggerWatch(settings)
    ref = identity(snap(prod, **ctx), GPUS)
    watch.observe(snap(prod, **ctx), GPUS, ref, sc, None, now=0.0)
    watch.forget()
    # The first poll after the cycle: the cumulative counts since the engine started are no window.
    assert watch.observe(snap(verify, **ctx), GPUS, ref, sc, None, now=170.0) == []
    assert watch.observe(snap(verify + prod, **ctx), GPUS, ref, sc, None, now=230.0) == []
    # A verify against a production that kept running: the window that held it is dropped.
    running = TriggerWatch(settings)
    running.observe(snap(prod, **ctx), GPUS, ref, sc, None, now=0.0)
    running.own_traffic(100.0, 160.0)
    assert running.observe(snap(prod + verify, **ctx), GPUS, ref, sc, None, now=160.5) == []  # not settled
    assert running.observe(snap(prod + verify, **ctx), GPUS, ref, sc, None, now=170.0) == []
    assert running.observe(snap(prod + verify + prod, **ctx), GPUS, ref, sc, None, now=230.0) == []
    # Real long traffic after it still fires.
    fired = running.observe(snap(prod + verify + prod + verify, **ctx), GPUS, ref, sc, None, now=290.0)
    assert [t.kind for t in fired] == [DRIFT]


def test_the_crashing_steps_prompts_are_the_oom_evidence_and_replayed_first(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=1) INFO started\n")
    watch = TriggerWatch(TriggerSettings(workload_drift=None), log)
    lengths = [3000] * 100
    ref = identity(snap(lengths), GPUS)
    assert watch.observe(snap(lengths), GPUS, ref, TUNED, None, now=0.0) == []
    with log.open("a") as f:  # the dump reaches the log a poll before the OOM line does
        f.write(LINE + "\n")
    assert watch.observe(snap(lengths), GPUS, ref, TUNED, None, now=1.0) == []
    with log.open("a") as f:
        f.write(OOM_LINE + "\n")
    fired = watch.observe(snap(lengths, reachable=False, error="refused"), GPUS, ref, TUNED, None, now=2.0)
    assert [t.kind for t in fired] == [OOM]
    evidence = fired[0].evidence
    assert evidence["crash_prompts"] == [5120, 4101, 3699] and evidence["crash_step_tokens"] == 7796
    assert evidence["max_model_len"] == CONTEXT
    changes = tune_changes(TUNED, OOM, evidence, ref)
    assert changes["workload.requests.include_prompt_tokens"] == [5120, 4101, 3699]
    assert changes["workload.requests.prompt_tokens"]["high"] >= 5120
    tuned = apply_changes(TUNED, changes)
    # The soak replays the scenario's workload, crash prompts first, at the longest the range now holds.
    soaked, _ = soak_scenario(tuned, {}, 60.0)
    assert soaked.workload.requests.include_prompt_tokens == [5120, 4101, 3699]
    assert soaked.workload.requests.prompt_tokens.value >= 5120
    # Cut to the context like the rest.
    small = tune_changes(TUNED, CRASH, {**evidence, "crash_prompts": [9000]}, ref)
    assert small["workload.requests.include_prompt_tokens"] == [CONTEXT - 256 - 16]
    # A crash with no dump in the log carries none.
    assert "workload.requests.include_prompt_tokens" not in tune_changes(
        TUNED, CRASH, {"prompt_tokens": histogram_dict(histogram(lengths))}, ref)


def test_production_like_the_scenario_is_not_drift_whatever_the_buckets() -> None:
    """benchmarks/daemon_chaos.py found it: prompts of 100-600 tokens (the scenario's own) read as p95 800
    inside vLLM's 500-1000 bucket against the scenario's exact 575 — a ratio of 1.39, a false drift."""
    sc = Scenario.model_validate({**SCENARIO, "workload": {**SCENARIO["workload"], "requests": {
        **SCENARIO["workload"]["requests"], "prompt_tokens": {"kind": "uniform", "low": 100, "high": 600}}}})
    settings = TriggerSettings(workload_drift=DriftSettings(p95_ratio=1.25, window_s=3600, min_requests=20))
    rng = random.Random(3)
    watch = TriggerWatch(settings)
    ref = identity(snap([]), GPUS)
    watch.observe(snap([]), GPUS, ref, sc, None, now=0.0)
    same = [rng.randint(100, 600) for _ in range(400)]
    assert watch.observe(snap(same), GPUS, ref, sc, None, now=60.0) == []
    # Prompts in a bucket above the scenario's p95 are drift.
    assert [t.kind for t in watch.observe(snap(same + [rng.randint(1200, 1900) for _ in range(400)]), GPUS, ref,
                                          sc, None, now=120.0)] == [DRIFT]
