"""The fitted memory model: it recovers known coefficients, its interval shrinks with trials, bounds
from OOM trials pull it up, and it carries over to another model."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from autotuner.engine import classify as oc
from autotuner.monitor import Threshold
from autotuner.scenario import load_scenario
from autotuner.sim.models import load_model
from autotuner.tuner.memory_model import BUDGET, OFFLOAD, UTIL, MemoryModel, rescale
from autotuner.tuner.runner import VirtualRunner
from autotuner.tuner.space import build_space
from tests.tuner.test_study import quickstart

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
        model.observe(n, flags, oc.OK, {"peak_fraction": peak, "total_bytes": [24 << 30]})
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
        model.observe(n, flags, oc.OK, {"peak_fraction": true_peak(flags), "total_bytes": [24 << 30]})
    skip = model.screen(over)
    assert skip is not None and skip.p_over >= 0.9 and skip.low > 0.97 - 0.05
    assert "predicted peak" in skip.reason and skip.to_attrs()["predicted:p_over"] == skip.p_over
    assert model.screen(under) is None
    # A trial that ran out of memory: everything at least as large is ruled out, with certainty.
    oom = {BUDGET: 4096, UTIL: 0.93, OFFLOAD: 0.0}
    model.observe(99, oom, oc.OOM_CRASH, {"peak_fraction": 1.0})
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
        elif result.outcome == oc.OK:
            held_out.append((flags, result.memory["peak_fraction"]))
    assert held_out and space
    errors = [abs(model.predict(f).peak_fraction - peak) for f, peak in held_out]
    assert max(errors) < 0.03, errors
    smaller = rescale(model, load_model("llama-2-13b"), load_model("llama-2-7b"), tensor_parallel=8)
    assert not smaller.observations and smaller.limit_fraction == model.limit_fraction
    old, new = model.coefficients, smaller.coefficients
    # 7B's activation per token is smaller than 13B's: the per-token terms shrink by the same ratio.
    assert abs(new["step"]) < abs(old["step"]) and np.isclose(new["util"], old["util"])
