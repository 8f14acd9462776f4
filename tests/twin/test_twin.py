"""The twin (autotuner.twin): calibrated on a box that deviates from its preset, it predicts what that box
measures; a twin-first study measures the twin's finalists and finds the box's best; a twin that stays
wrong hands the search back to the sampler and says so; `autotuner twin STUDY` shows all of it.

Every box here is a GPU description file with deviation fields (catalog.gpus.BoxDeviation): the ground
truth the twin never sees (it starts from the preset), run through the simulator's engine core in
virtual time on real SQLite.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotuner.catalog.gpus import GPU_PRESETS
from autotuner.cli.app import app
from autotuner.scenario import Scenario
from autotuner.store.db import Store, TrialRecord
from autotuner.trials.outcomes import Outcome, TrialKind
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.space import build_space
from autotuner.tuner.study import Tuner
from autotuner.twin.box import TwinBox, twin_box
from autotuner.twin.calibrate import Observation, calibrate
from autotuner.twin.guide import TwinGuide
from autotuner.twin.params import PRIOR
from autotuner.twin.search import TwinSearch, coarse_grid
from autotuner.vllm.flags import UTILIZATION

RTX_4090 = GPU_PRESETS["rtx-4090"]
INVENTORY = [f"{RTX_4090.product_name} ({RTX_4090.memory_gib:.2f} GiB)"]
DEVIATION = {"compute_efficiency": 0.8, "bandwidth_efficiency": 0.88, "step_overhead_s": 0.005,
             "non_torch_gib": 0.6, "transient_scale": 1.4}


def box_file(tmp: Path, **fields: Any) -> str:
    data = {"name": "box", "product_name": RTX_4090.product_name, "memory_gib": RTX_4090.memory_gib,
            "bandwidth_gbps": RTX_4090.bandwidth_gbps, "fp16_tflops": RTX_4090.fp16_tflops,
            "pcie_gbps": RTX_4090.pcie_gbps, "nvlink_gbps": 0.0, **fields}
    path = tmp / f"box-{len(list(tmp.glob('box-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def scenario(gpu: str, noise: float = 0.0, **workload: Any) -> Scenario:
    """Llama-2-7B on one (perhaps deviating) RTX 4090, prompts of 500-2500 tokens at concurrency 6."""
    requests = {"count": 16, "prompt_tokens": {"kind": "uniform", "low": 500, "high": 2500}, "output_tokens": 48,
                **workload}
    return Scenario.model_validate({
        "name": "twin", "engine": {"kind": "sim-virtual", "model": "llama-2-7b", "flags": {"max-model-len": 4096},
                                   "sim": {"gpu": gpu, "noise": noise}},
        "workload": {"requests": requests, "arrivals": {"kind": "concurrency", "concurrency": 6}, "seed": 3},
        "slos": {"ttft_p95_s": 30.0},
    })


def measure(sc: Scenario, flags: dict[str, Any], number: int) -> Observation:
    result = VirtualRunner(sc).evaluate(flags)
    peaks = result.memory.get("peak_bytes") or []
    totals = result.memory.get("total_bytes") or []
    metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)}
    kv = result.engine.get("kv_cache_tokens")
    return Observation(number, "search", dict(flags), str(result.outcome), metrics,
                       int(max(peaks)) if peaks else None, int(max(totals)) if totals else None,
                       int(kv) if isinstance(kv, int) else None)


def flags(budget: int, util: float) -> dict[str, Any]:
    return {"max-model-len": 4096, "max-num-batched-tokens": budget, "gpu-memory-utilization": util,
            "cpu-offload-gb": 0.0}


def the_twin(sc: Scenario) -> TwinBox:
    box = twin_box(sc, INVENTORY, VirtualRunner)
    assert isinstance(box, TwinBox), box
    return box


def test_calibration_learns_the_box_it_was_measured_on(tmp_path: Path) -> None:
    real = scenario(box_file(tmp_path, **DEVIATION))
    twin = the_twin(scenario("rtx-4090"))
    assert twin.preset == RTX_4090  # the preset, never the box file
    seen = [measure(real, flags(b, u), i) for i, (b, u) in enumerate([(512, 0.85), (2048, 0.9), (8192, 0.8)])]
    held_out = measure(real, flags(1024, 0.88), 9)

    def error(params: Any) -> float:
        predicted = twin.predict(held_out.flags, params).metrics["output_tokens_per_s"]
        return abs(predicted / held_out.metrics["output_tokens_per_s"] - 1)

    cal = calibrate(twin, seen)
    p = cal.params
    # The memory parameters come from their own evidence: vLLM's logged KV cache size and the peaks.
    assert p.non_torch_gib.value == pytest.approx(0.6, abs=0.05)
    assert p.transient_scale.low <= 1.4 <= p.transient_scale.high
    # The performance fit moves from the preset towards the box, its 95 % intervals around the truth.
    assert p.bandwidth_efficiency.low <= 0.88 <= p.bandwidth_efficiency.high
    assert p.compute_efficiency.value < 0.95
    assert error(PRIOR) > 0.08  # the preset's twin is wrong about this box ...
    assert error(p) < 0.04  # ... the calibrated one predicts a config it never saw
    assert cal.error_p50 is not None and cal.error_p50 < 0.04


def run_study(tmp: Path, sc: Scenario, trials: int, twin: bool) -> tuple[Any, optuna.Study, Store, str]:
    store = Store(f"sqlite:///{tmp}/twin-{int(twin)}-{len(list(tmp.glob('*.db')))}.db")
    tuner = Tuner(sc, VirtualRunner(sc), store, n_trials=trials, seed=0, twin=twin)
    summary = asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    return summary, study, store, tuner.study_name


def best_true(sc_exact: Scenario, study: optuna.Study) -> float:
    """The best feasible measured config of the study, re-evaluated noise-free on the box."""
    runner = VirtualRunner(sc_exact)
    feasible = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("feasible")]
    assert feasible
    best = max(feasible, key=lambda t: t.user_attrs.get("metric:output_tokens_per_s") or 0.0)
    return float(runner.evaluate({"max-model-len": 4096, **{k: v for k, v in best.params.items()}})
                 .metrics["output_tokens_per_s"])


def test_a_twin_first_study_measures_the_twins_finalists_and_finds_the_best(tmp_path: Path) -> None:
    gpu = box_file(tmp_path, **DEVIATION)
    summary, study, store, name = run_study(tmp_path, scenario(gpu, noise=0.03), 6, twin=True)
    kinds = [t.user_attrs.get("kind") for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    assert kinds[0] == TrialKind.BASELINE
    finalists = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("kind") == TrialKind.TWIN]
    assert finalists and all(isinstance(t.user_attrs.get("twin_predicted"), float) for t in finalists)
    assert "guided" in summary.twin and "rtx-4090" in summary.twin
    # Against a grid over the same space on the box itself (noise-free): the twin's pick is near its best.
    exact = scenario(gpu)
    runner = VirtualRunner(exact)
    grid = [runner.evaluate(flags(b, u)) for b in (256, 512, 1024, 2048, 4096, 8192) for u in (0.8, 0.85, 0.9, 0.94)]
    oracle = max(r.metrics["output_tokens_per_s"] or 0.0 for r in grid
                 if r.outcome == "ok" and (r.metrics.get("ttft_p95_s") or math.inf) <= 30.0)
    assert best_true(exact, study) >= 0.95 * oracle
    # `autotuner twin STUDY` shows the calibration and every measured trial against the twin.
    cli = CliRunner()
    shown = cli.invoke(app, ["twin", name, "--storage", store.url])
    assert shown.exit_code == 0, shown.output
    assert "bandwidth efficiency" in shown.output and "twin of rtx-4090" in shown.output
    assert "finalists p50" in shown.output
    data = json.loads(cli.invoke(app, ["twin", name, "--storage", store.url, "--json"]).output)
    assert data["preset"] == "rtx-4090" and len(data["trials"]) >= 3
    assert data["finalists_error_p50"] is not None and data["finalists_error_p50"] < 0.15
    # The certificate quotes the twin's error on this box beside the simulator's published-run accuracy.
    out = tmp_path / "vllm.yaml"
    exported = cli.invoke(app, ["export", "--storage", store.url, "--study", name, "--format", "yaml", "-o", str(out),
                                "--allow-unverified"])
    assert exported.exit_code == 0, exported.output
    twin_line = next(line for line in out.read_text().splitlines() if line.startswith("# twin: "))
    assert "finalist(s) of the calibrated twin" in twin_line and "published runs" in twin_line


def test_a_twin_that_stays_wrong_hands_the_search_back_and_says_so(tmp_path: Path) -> None:
    """A card that calls itself an RTX 4090 but runs at a fifth of its bandwidth and a tenth of its compute:
    beyond what the priors let the fit explain, so the twin's finalists keep missing."""
    gpu = box_file(tmp_path, bandwidth_gbps=200.0, fp16_tflops=16.0)
    sc = scenario(gpu)
    sc = sc.model_copy(update={"slos": {"ttft_p95_s": 600.0}})
    summary, study, _, _ = run_study(tmp_path, sc, 7, twin=True)
    assert summary.twin.startswith("twin: off"), summary.twin
    assert "searching as without it" in summary.twin
    kinds = [t.user_attrs.get("kind") for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    last_twin = max(i for i, k in enumerate(kinds) if k == TrialKind.TWIN)
    assert any(k in (TrialKind.SEARCH, TrialKind.REPAIRED, TrialKind.PROBE) for k in kinds[last_twin + 1:])
    assert summary.trials_done == 7  # the budget is spent as without a twin


def test_no_twin_where_the_simulator_cannot_stand_for_the_box(tmp_path: Path) -> None:
    sc = scenario("rtx-4090")
    assert twin_box(sc, [], VirtualRunner) == "no simulator preset for the GPUs (none)"
    mixed = [INVENTORY[0], "NVIDIA GeForce RTX 3090 (23.69 GiB)"]
    assert str(twin_box(sc, mixed, VirtualRunner)).startswith("no simulator preset for the GPUs")
    unknown = sc.model_copy(update={"engine": sc.engine.model_copy(update={"model": str(tmp_path / "nothing")})})
    assert "cannot read model" in str(twin_box(unknown, INVENTORY, VirtualRunner))


def test_twin_of_a_missing_study_is_one_error_line(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/empty.db")
    result = CliRunner().invoke(app, ["twin", "nope", "--storage", store.url])
    assert result.exit_code == 2
    assert "no study 'nope'" in result.output and "Traceback" not in result.output


def test_the_transient_scale_is_fitted_where_the_transient_is_large(tmp_path: Path) -> None:
    """Small token budgets' peaks are mostly steady memory: one run's allocator jitter over their small
    transient must not set the scale (a median of per-trial ratios made a 0.8 box look 1.3)."""
    gpu = box_file(tmp_path, transient_scale=0.8)
    twin = the_twin(scenario("rtx-4090"))
    # Each its own engine run: its own draw of the allocator's jitter.
    seen = [measure_run(scenario(gpu, noise=0.03), flags(b, 0.9), run) for b, run in [(256, 1), (384, 2), (4096, 3)]]
    p = calibrate(twin, seen).params.transient_scale
    assert p.low <= 0.8 <= p.high
    assert abs(p.value - 0.8) < 0.3


def measure_run(sc: Scenario, flags_: dict[str, Any], run: int) -> Observation:
    result = VirtualRunner(sc, first_run=run).evaluate(flags_)
    peaks, totals = result.memory.get("peak_bytes") or [], result.memory.get("total_bytes") or []
    kv = result.engine.get("kv_cache_tokens")
    return Observation(run, "search", dict(flags_), str(result.outcome),
                       {k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)},
                       int(max(peaks)) if peaks else None, int(max(totals)) if totals else None,
                       int(kv) if isinstance(kv, int) else None)


def kv_hungry(concurrency: int, ttft_p95_s: float) -> tuple[Any, TwinSearch]:
    """Long prompts (1500-3500 tokens) at `concurrency` under a TTFT SLO only a large KV cache meets: the
    space and the preset twin's search."""
    data = scenario("rtx-4090").model_dump(mode="json", exclude_none=True)
    data["workload"]["arrivals"]["concurrency"] = concurrency
    data["workload"]["requests"].update(count=48, prompt_tokens={"kind": "uniform", "low": 1500, "high": 3500})
    data["slos"] = {"ttft_p95_s": ttft_p95_s}
    sc = Scenario.model_validate(data)
    space = build_space(sc)
    twin = the_twin(sc)
    return space, TwinSearch(twin, sc, space, calibrate(twin, []))


def test_the_twin_finds_a_feasible_band_its_coarse_grid_steps_over() -> None:
    """A TTFT SLO that only a large KV cache meets puts every feasible point at high utilisation, between
    the coarse grid's points: the search refines around the nearest misses and finds them."""
    space, search = kv_hungry(concurrency=24, ttft_p95_s=10.0)
    assert not search.ranked(search.predict(p) for p in coarse_grid(space))  # the grid alone: nothing feasible
    found = search.run()
    assert found and all(c.result.metrics["ttft_p95_s"] <= 10.0 for c in found)


def test_the_twin_searches_along_its_memory_wall() -> None:
    """Long prompts at concurrency 16 and a 6 s TTFT p95: only the highest utilization that fits serves
    within the SLO. The coarse grid's four utilizations (0.7 … 0.95) step over it and refining around
    the nearest misses did not reach it (on benchmarks/twin_first.py's 4090-tp1 box the first finalist
    was such a miss, at 0.89); the wall, bisected per point of the other axes, is where it lies."""
    space, search = kv_hungry(concurrency=16, ttft_p95_s=6.0)
    grid = coarse_grid(space)
    assert not search.ranked(search.predict(p) for p in grid)
    util = space.distributions[UTILIZATION]
    walls = search.walls(grid)
    assert walls
    for wall in walls:  # the highest utilization with room, one step more has none
        assert search.predict(wall).margin_bytes >= 0
        if wall[UTILIZATION] < util.high:
            assert search.predict({**wall, UTILIZATION: round(wall[UTILIZATION] + util.step, 6)}).margin_bytes < 0
    found = search.run()
    assert found and found[0].result.metrics["ttft_p95_s"] <= 6.0
    assert found[0].params[UTILIZATION] not in {p[UTILIZATION] for p in grid}


def test_a_pruned_finalist_is_no_miss_of_the_twin_but_one_out_of_memory_is(tmp_path: Path) -> None:
    """The pruner stops a trial once `keep` measured ones beat its optimistic bound: often one within
    noise of the best, with no full figure to hold the prediction against. Two such counted as 100 %
    misses once turned off a twin whose measured finalists were within 3 % (3090-tp8, seed 2)."""
    sc = scenario("rtx-4090")
    guide = TwinGuide(sc, build_space(sc), Store(f"sqlite:///{tmp_path}/g.db"), "g", None)

    def finalist(number: int, predicted: float, outcome: str, measured: float | None) -> tuple[Any, TrialRecord]:
        trial = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0, user_attrs={
            "kind": TrialKind.TWIN, "twin_predicted": predicted, "twin_feasible": True, "twin_evidence": number})
        trial.number = number
        metrics = {} if measured is None else {"output_tokens_per_s": measured}
        return trial, TrialRecord(number, TrialKind.TWIN, outcome, None, "COMPLETE", {}, {"metrics": metrics})

    rows = [finalist(1, 124.8, Outcome.OK, 117.3), finalist(2, 123.7, Outcome.PRUNED, 66.6),
            finalist(3, 122.5, Outcome.PRUNED, 65.6), finalist(4, 123.7, Outcome.OK, 120.0)]
    guide.finalists = guide._finalists([t for t, _ in rows], {r.trial_number: r for _, r in rows})
    assert [f["number"] for f in guide.finalists] == [1, 4]
    assert guide._wrong() is None
    rows += [finalist(5, 121.0, Outcome.OOM_CRASH, None), finalist(6, 121.0, Outcome.OOM_CRASH, None)]
    guide.finalists = guide._finalists([t for t, _ in rows], {r.trial_number: r for _, r in rows})
    assert [f["error"] for f in guide.finalists][-2:] == [1.0, 1.0]
    assert "searching as without it" in (guide._wrong() or "")
