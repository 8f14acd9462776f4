"""The fitted memory model: it recovers known coefficients, its interval shrinks with trials, bounds
from OOM trials pull it up, and it carries over to another model."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from autotuner.catalog.models import load_model
from autotuner.monitor import Threshold
from autotuner.scenario import Scenario, load_scenario
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult
from autotuner.tuner.memory_model import BUDGET, OFFLOAD, UTIL, MemoryModel
from autotuner.tuner.memory_repair import repair
from autotuner.tuner.memory_warm_start import rescale
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.space import build_space
from tests.support.quickstart import quickstart

# peak / total = 0.02 + 1.0 util + 0.03 per 10k budget tokens + 0.09 per 10k step tokens − 0.2 per 100 GiB offload
TRUE = {"const": 0.02, "util": 1.0, "budget": 0.03, "step": 0.09, "offload": -0.2}
CAP = 6000.0


def true_peak(flags: dict[str, float]) -> float:
    b = flags[BUDGET]
    return (TRUE["const"] + TRUE["util"] * flags[UTIL] + TRUE["budget"] * b / 1e4 + TRUE["step"] * min(b, CAP) / 1e4
            + TRUE["offload"] * flags[OFFLOAD] / 100)


def random_flags(rng: random.Random) -> dict[str, float]:
    return {BUDGET: round(256 * 64 ** rng.random()), UTIL: round(rng.uniform(0.6, 0.85), 2),
            OFFLOAD: rng.choice([0.0, 2.0, 4.0, 8.0])}


def test_recovers_known_coefficients_and_the_interval_shrinks() -> None:
    rng = random.Random(7)
    model = MemoryModel(threshold=Threshold(fraction=0.97), step_cap=CAP)
    probe = {BUDGET: 8192, UTIL: 0.9, OFFLOAD: 2.0}
    widths = []
    for n in range(40):
        flags = random_flags(rng)
        peak = true_peak(flags) + rng.gauss(0, 0.002)
        model.observe(n, flags, Outcome.OK, {"peak_fraction": peak, "total_bytes": [24 << 30]})
        if n + 1 in (3, 10, 40):
            p = model.predict(probe)
            widths.append(p.high - p.low)
    assert widths[0] > widths[1] > widths[2], widths
    got = model.coefficients
    assert abs(got["util"] - TRUE["util"]) < 0.03, got
    assert abs(got["const"] - TRUE["const"]) < 0.03, got
    assert abs(got["step"] + got["budget"] - TRUE["step"] - TRUE["budget"]) < 0.02, got
    p = model.predict(probe)
    assert p.low <= true_peak(probe) <= p.high
    assert abs(p.peak_fraction - true_peak(probe)) < 0.01


def test_screen_needs_confidence_and_oom_bounds_count() -> None:
    rng = random.Random(3)
    model = MemoryModel(threshold=Threshold(fraction=0.97), step_cap=CAP)
    over = {BUDGET: 16384, UTIL: 0.96, OFFLOAD: 0.0}  # true peak 1.047
    under = {BUDGET: 1024, UTIL: 0.80, OFFLOAD: 0.0}  # true peak 0.832
    assert model.screen(over) is None, "no measurement yet: the prior alone judges nothing"
    for n in range(12):
        flags = random_flags(rng)
        model.observe(n, flags, Outcome.OK, {"peak_fraction": true_peak(flags), "total_bytes": [24 << 30]})
    skip = model.screen(over)
    assert skip is not None and skip.p_over >= 0.9 and skip.low > 0.97 - 0.05
    assert "predicted peak" in skip.reason and skip.to_attrs()["predicted:p_over"] == skip.p_over
    assert model.screen(under) is None
    # A trial that ran out of memory: everything at least as large is ruled out, with certainty.
    oom = {BUDGET: 4096, UTIL: 0.93, OFFLOAD: 0.0}
    model.observe(99, oom, Outcome.OOM_CRASH, {"peak_fraction": 1.0})
    ruled = model.screen({BUDGET: 8192, UTIL: 0.93, OFFLOAD: 0.0})
    assert ruled is not None and ruled.blocker == 99 and ruled.p_over == 1.0


def test_fits_the_simulator_and_rescales_to_another_model(tmp_path: Path) -> None:
    """On the simulator's trials (not its formulas): predictions within a few % of measured peaks."""
    scenario = load_scenario(quickstart(tmp_path))
    runner = VirtualRunner(scenario)
    space = build_space(scenario)
    model = MemoryModel.for_scenario(scenario, {})
    rng = random.Random(1)
    held_out = []
    for n in range(16):
        flags = {**scenario.engine.flags, BUDGET: rng.choice([512, 1024, 2048, 4096]),
                 UTIL: round(rng.uniform(0.85, 0.95), 2), OFFLOAD: rng.choice([0.0, 1.0, 2.0])}
        result = runner.evaluate(flags)
        if n < 12:
            model.observe(n, flags, result.outcome, result.memory, result.reason)
        elif result.outcome == Outcome.OK:
            held_out.append((flags, result.memory["peak_fraction"]))
    assert held_out and space
    errors = [abs(model.predict(f).peak_fraction - peak) for f, peak in held_out]
    assert max(errors) < 0.03, errors
    smaller = rescale(model, load_model("llama-2-13b"), load_model("llama-2-7b"), tensor_parallel=8)
    assert not smaller.observations and smaller.limit_fraction == model.limit_fraction
    old, new = model.coefficients, smaller.coefficients
    # 7B's activation per token is smaller than 13B's: the per-token terms shrink by the same ratio.
    assert abs(new["step"]) < abs(old["step"]) and np.isclose(new["util"], old["util"])


def llama3_4090() -> Scenario:
    """Llama-3-8B at max-model-len 8192 on one 24 GB card: low utilizations cannot start."""
    return Scenario.model_validate({
        "name": "llama3-8b-rtx4090",
        "engine": {"kind": "sim-virtual", "model": "llama-3-8b", "flags": {"max-model-len": 8192},
                   "sim": {"gpu": "rtx-4090", "gpus": 1}},
        "oom_threshold": {"fraction": 0.97},
        "workload": {"requests": {"count": 8, "prompt_tokens": {"kind": "uniform", "low": 500, "high": 3000},
                                  "output_tokens": 32},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}},
    })


def test_the_shape_rules_out_what_cannot_start_before_any_failure() -> None:
    scenario = llama3_4090()
    runner = VirtualRunner(scenario)
    model = MemoryModel.for_scenario(scenario, {})
    cannot = {**scenario.engine.flags, UTIL: 0.70, BUDGET: 8192, OFFLOAD: 0.0}
    skip = model.screen(cannot)
    assert skip is not None and skip.reason.startswith("cannot start"), skip
    assert runner.evaluate(cannot).outcome == Outcome.STARTUP_FAILED  # the simulator agrees
    can = {**scenario.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 0.0}
    assert model.screen(can) is None
    assert runner.evaluate(can).outcome != Outcome.STARTUP_FAILED
    # A measurement beats the shape: a trial that started with less room says the shape was wrong.
    model.observe(1, {**cannot, UTIL: 0.70, BUDGET: 16384}, Outcome.OK, {"peak_fraction": 0.75})
    assert model.screen(cannot) is None


def test_offload_is_screened_only_when_not_needed() -> None:
    scenario = llama3_4090()
    model = MemoryModel.for_scenario(scenario, {})
    skip = model.screen({**scenario.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 4.0})
    assert skip is not None and skip.reason.startswith("offload not needed"), skip
    # Where the card cannot hold the weights with a max-model-len request, offload is the way in.
    data = llama3_4090().model_dump()
    data["engine"]["model"] = "llama-2-13b"
    data["engine"]["flags"] = {"max-model-len": 4096}
    big = Scenario.model_validate(data)
    big_model = MemoryModel.for_scenario(big, {})
    assert big_model.screen({**big.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 10.0}) is None
    assert big_model.screen({**big.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 0.0}) is not None
    # A measured startup failure without offload makes offload needed, whatever the shape says.
    model.observe(2, {UTIL: 0.95, BUDGET: 256, OFFLOAD: 0.0}, Outcome.STARTUP_FAILED, {},
                  "ValueError: No available memory for the cache blocks.")
    assert model.screen({**scenario.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 4.0}) is None


def test_probe_low_end_is_the_lowest_utilization_that_starts() -> None:
    scenario = llama3_4090()
    runner = VirtualRunner(scenario)
    space = build_space(scenario)
    model = MemoryModel.for_scenario(scenario, {})
    base = {**scenario.engine.flags, UTIL: 0.90, BUDGET: 2048, OFFLOAD: 0.0}
    model.observe(0, base, *_measured(runner.evaluate(base)))
    low = model.probe(space, base, 1)
    assert low is not None and low[UTIL] > space.distributions[UTIL].low  # type: ignore[attr-defined]
    assert runner.evaluate(low).outcome != Outcome.STARTUP_FAILED, low


def test_repair_shrinks_the_budget_before_giving_up_utilization() -> None:
    rng = random.Random(5)
    space = build_space(llama3_4090())
    model = MemoryModel(threshold=Threshold(fraction=0.97), step_cap=CAP)
    for n in range(12):
        flags = random_flags(rng)
        model.observe(n, flags, Outcome.OK, {"peak_fraction": true_peak(flags), "total_bytes": [24 << 30]})
    ruled = {BUDGET: 16384, UTIL: 0.95, OFFLOAD: 0.0}  # true peak 1.07
    assert model.screen(ruled) is not None
    nearest = repair(model, space, ruled)
    assert nearest is not None and model.screen(nearest) is None
    assert true_peak(nearest) < 0.97, nearest
    # Lowering utilization alone would have to drop to ~0.82; a smaller budget keeps most of the KV cache.
    assert nearest[UTIL] >= 0.88 and nearest[BUDGET] < 16384, nearest


def _measured(result: TrialResult) -> tuple[str, dict[str, object], str]:
    return result.outcome, result.memory, result.reason


def test_repair_drops_an_offload_that_is_not_needed() -> None:
    scenario = llama3_4090()
    model = MemoryModel.for_scenario(scenario, {})
    ruled = {**scenario.engine.flags, UTIL: 0.90, BUDGET: 1024, OFFLOAD: 9.0}
    assert model.screen(ruled) is not None
    nearest = repair(model, build_space(scenario), ruled)
    assert nearest is not None and nearest[OFFLOAD] == 0.0 and nearest[UTIL] == 0.90, nearest
