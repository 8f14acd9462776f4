"""The offload axis in a study: `offload-mode` (none | uva | prefetch) with `offload-gib` (GiB freed per
GPU), turned into vLLM's flags per candidate; the tuner finds the backend the workload favours, and the
trials say why (outcome, reason, throughput, the flags that ran)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from autotuner.errors import ScenarioError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.offload_axis import from_flags
from autotuner.trials.result import TrialResult
from autotuner.trials.scoring import constraints_of, feasible
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.space import build_space, offload_shape
from autotuner.tuner.study import Tuner

AXIS = {"offload-mode": {"type": "categorical", "choices": ["none", "uva", "prefetch"]},
        "offload-gib": {"type": "float", "low": 4.0, "high": 12.0, "step": 1.0}}


def scenario(model: str, prompts: tuple[int, int], outputs: int, ttft_s: float,
             space: dict | None = None) -> Scenario:
    return Scenario.model_validate({
        "name": f"offload-{model}",
        "engine": {"kind": "sim-virtual", "model": model,
                   "flags": {"max-model-len": 2048, "gpu-memory-utilization": 0.88, "max-num-batched-tokens": 2048},
                   "sim": {"gpu": "rtx-4090", "gpus": 1, "noise": 0}},
        "oom_threshold": {"fraction": 0.97},
        "workload": {"requests": {"count": 8, "prompt_tokens": {"kind": "uniform", "low": prompts[0],
                                                                "high": prompts[1]},
                                  "output_tokens": outputs},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}, "warmup_requests": 1, "seed": 1},
        "slos": {"ttft_p95_s": ttft_s},
        "search_space": AXIS if space is None else space,
    })


def tune(tmp_path: Path, sc: Scenario, trials: int = 14) -> list:
    store = Store(str(tmp_path / "study.db"))
    tuner = Tuner(sc, VirtualRunner(sc), store, n_trials=trials, seed=5)
    asyncio.run(tuner.run())
    return store.trials(tuner.study_name)


def best_by_mode(rows: list, sc: Scenario) -> dict[str, float]:
    """The best output throughput per offload mode among the trials that met the SLO."""
    best: dict[str, float] = {}
    for r in rows:
        mode = from_flags(r.flags, offload_shape(sc))[0]
        tput = r.metrics.get("output_tokens_per_s")
        if r.outcome == "ok" and tput is not None and feasible(constraints_of(TrialResult(
                r.outcome, r.reason, dict(r.flags), [], metrics=r.metrics, memory=r.memory), sc)):
            best[mode] = max(best.get(mode, 0.0), float(tput))
    return best


def test_weights_that_do_not_fit_find_prefetch_on_long_prompts(tmp_path: Path) -> None:
    # Llama-2-13B (24.2 GiB) on one RTX 4090: nothing starts without offload. Prompt-heavy requests
    # make most steps 2048-token prefill chunks that compute about as long as the offloaded layers take
    # to copy, so prefetch hides the copies (~1.3× at 10 GiB freed); UVA pays them on top.
    sc = scenario("llama-2-13b", (1500, 1900), 8, 30.0)
    rows = tune(tmp_path, sc)
    shape = offload_shape(sc)
    for r in rows:  # the flags that ran are vLLM's, one backend at a time
        assert not ("cpu-offload-gb" in r.flags and "offload-group-size" in r.flags)
    nothing = [r for r in rows if from_flags(r.flags, shape)[0] == "none"]
    # Without offload the weights do not load: run once (the baseline), then ruled out by the memory model.
    assert nothing and all("Failed to load model" in (r.reason or "") or "trial 0, which could not start"
                           in (r.reason or "") for r in nothing)
    best = best_by_mode(rows, sc)
    assert "prefetch" in best and "uva" in best, best
    assert best["prefetch"] > 1.1 * best["uva"], best
    assert max(best, key=best.__getitem__) == "prefetch"


def test_a_model_that_fits_keeps_its_weights_on_the_gpu(tmp_path: Path) -> None:
    # Llama-3-8B fits a 4090: every offloaded byte only slows decoding, whichever backend moves it.
    sc = scenario("llama-3-8b", (200, 400), 64, 30.0)
    best = best_by_mode(tune(tmp_path, sc, trials=10), sc)
    assert "none" in best and max(best, key=best.__getitem__) == "none", best


def test_the_axis_is_checked_and_clamped(tmp_path: Path) -> None:
    sc = scenario("llama-2-13b", (100, 200), 16, 30.0)
    space = build_space(sc)
    assert space.offload_shape is not None and space.offload_shape.num_layers == 40
    flags = space.to_flags({"offload-mode": "prefetch", "offload-gib": 3.0})
    assert flags["offload-backend"] == "prefetch"
    assert int(flags["offload-num-in-group"]) <= int(flags["offload-group-size"])
    assert space.clamp(flags)["offload-mode"] == "prefetch"
    assert space.clamp({"cpu-offload-gb": 6.0}) == {"offload-mode": "uva", "offload-gib": 6.0}
    assert space.clamp({"cpu-offload-gb": 2.0}) == {"offload-mode": "uva", "offload-gib": 4.0}  # into range
    assert space.clamp({}) == {"offload-mode": "none", "offload-gib": 4.0}
    bad = scenario("llama-2-13b", (100, 200), 16, 30.0,
                   {**AXIS, "cpu-offload-gb": {"type": "float", "low": 0, "high": 2}})
    with pytest.raises(ScenarioError, match="sets the offload flags itself"):
        build_space(bad)
    alone = scenario("llama-2-13b", (100, 200), 16, 30.0, {"offload-mode": AXIS["offload-mode"]})
    with pytest.raises(ScenarioError, match=r"needs search_space\.offload-gib"):
        build_space(alone)
