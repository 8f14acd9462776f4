"""Offload that actually happened: an engine that ignores --cpu-offload-gb is caught, never exported."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from autotuner.analysis.evidence import confirmations
from autotuner.analysis.selection import select
from autotuner.catalog.models import weights_per_gpu_gib
from autotuner.errors import UserInputError
from autotuner.export.exporter import run_export
from autotuner.sim.gpu_state import GpuHost
from autotuner.store.db import TrialRecord
from autotuner.trials.result import TrialResult
from autotuner.trust.offload import check, logged_offload_gib
from autotuner.tuner.runners import VirtualRunner
from tests.support.sim import SimServer
from tests.support.virtual_studies import scenario, tune

OFFLOAD = "cpu-offload-gb"
FIXED = {"max-model-len": 4096, "gpu-memory-utilization": 0.84, "max-num-batched-tokens": 1024}


def _record(number: int, result: TrialResult) -> TrialRecord:
    return TrialRecord(number, "search", result.outcome, result.reason, "COMPLETE", result.flags, result.to_dict())


@pytest.mark.parametrize("ignores", [False, True])
def test_offload_check_on_the_simulated_engine(ignores: bool) -> None:
    flags = {**FIXED, **({"sim-ignore-cpu-offload": True} if ignores else {})}
    runner = VirtualRunner(scenario(**{"engine.flags": flags}))
    reference = _record(0, runner.evaluate({OFFLOAD: 0}))
    verdict = check(runner.evaluate({OFFLOAD: 4}), [reference])
    assert verdict is not None and verdict["reference_trial"] == 0
    if ignores:
        assert verdict["verified"] is False and "ignores the flag" in verdict["reason"]
    else:
        assert verdict["verified"] is True
        assert verdict["reference_model_load_gib"] - verdict["model_load_gib"] == pytest.approx(4, abs=0.1)
    assert check(runner.evaluate({OFFLOAD: 0}), [reference]) is None  # nothing asked, nothing to check


@pytest.mark.parametrize("ignores", [False, True])
def test_without_a_trial_that_loaded_the_weights_the_shape_stands_in(ignores: bool) -> None:
    # The box where only offload serves: no trial without offload ever logged a weights footprint.
    flags = {**FIXED, **({"sim-ignore-cpu-offload": True} if ignores else {})}
    sc = scenario(**{"engine.flags": flags})
    shape = weights_per_gpu_gib(sc.engine.model, sc.tensor_parallel_size())
    assert shape is not None
    verdict = check(VirtualRunner(sc).evaluate({OFFLOAD: 4}), [], shape)
    assert verdict is not None and verdict["reference_trial"] is None
    if ignores:
        assert verdict["verified"] is False and "ignores the flag" in verdict["reason"]
    else:
        assert verdict["verified"] is True and "the model's shape" in verdict["reason"], verdict
        assert verdict["reference_model_load_gib"] == shape
    # A shape that does not account for what loaded (a quantized checkpoint's weights are a quarter of
    # what its shape says): no verdict either way, rather than a drop that is no offload.
    unknown = check(VirtualRunner(scenario(**{"engine.flags": FIXED})).evaluate({OFFLOAD: 4}), [], shape * 4)
    assert unknown is not None and unknown["verified"] is None
    without = check(VirtualRunner(sc).evaluate({OFFLOAD: 4}), [], None)  # no shape known (a hub name offline)
    assert without is not None and without["verified"] is (False if ignores else None)


def test_an_engine_ignoring_offload_is_caught_and_not_exported(tmp_path: Path) -> None:
    flags = {**FIXED, "sim-ignore-cpu-offload": True}
    # Offload only: every candidate claims 4 GiB offloaded; none did.
    t = tune(tmp_path, scenario(**{"engine.flags": flags, "search_space": {
        OFFLOAD: {"type": "categorical", "choices": [4.0]}}}), trials=2)
    t.trust(top=1, repeats=2, soak_s=30)
    rows = t.store.trials(t.study)
    c = next(iter(confirmations(rows).values()))
    assert c.offload is not None and c.offload["verified"] is False
    with pytest.raises(UserInputError, match="offload not verified"):
        run_export(t.storage, None, [], "knee", "yaml", tmp_path / "v.yaml", force=False)
    assert not (tmp_path / "v.yaml").exists()


def test_with_a_reference_the_ignoring_candidate_loses_to_the_honest_one(tmp_path: Path) -> None:
    flags = {**FIXED, "sim-ignore-cpu-offload": True}
    # The offloading config is what the user runs today (`current_config`): measured as it is, where the memory
    # model would skip a searched one as "offload not needed".
    t = tune(tmp_path, scenario(**{"engine.flags": flags, "current_config": {OFFLOAD: 4.0}, "search_space": {
        OFFLOAD: {"type": "categorical", "choices": [0.0, 4.0]}}}), trials=4)
    assert {r.flags[OFFLOAD] for r in t.store.trials(t.study) if r.outcome == "ok"} == {0.0, 4.0}
    t.trust(top=2, repeats=2, soak_s=30)
    chosen = select(t.storage, None, [], "knee")
    assert chosen.chosen.flags[OFFLOAD] == 0.0 and not chosen.missing
    offloaded = [c for n, c in confirmations(t.store.trials(t.study)).items() if c.offload is not None]
    assert offloaded and all(c.offload_failed for c in offloaded)  # type: ignore[union-attr]


def _stop(server: SimServer, state: Path) -> None:
    """Stop the server and wait until its simulated GPU memory is released (the next one needs it)."""
    server.kill_group()
    host = GpuHost(state)
    deadline = time.monotonic() + 30
    while host.used_bytes(0) > 0:
        assert time.monotonic() < deadline, "simulated GPU memory not released"
        time.sleep(0.1)


def test_the_load_log_names_the_offload_only_when_it_happened(sim_server: type[SimServer], sim_state: Path) -> None:
    base = ["llama-2-7b", "--sim-gpu", "rtx-4090", "--max-model-len", "2048", "--cpu-offload-gb", "2",
            "--sim-speedup", "50"]
    honest = sim_server.start(base)
    _stop(honest, sim_state)
    ignoring = sim_server.start([*base, "--sim-ignore-cpu-offload"])
    _stop(ignoring, sim_state)

    def logged(server: SimServer) -> float | None:
        return logged_offload_gib(TrialResult("ok", None, {OFFLOAD: 2}, [], engine={"log_path": str(server.log_path)}))

    assert logged(honest) == pytest.approx(2.0)
    assert logged(ignoring) is None


def test_each_server_launch_is_another_noise_run(sim_server: type[SimServer], sim_state: Path) -> None:
    args = ["llama-2-7b", "--sim-gpu", "rtx-4090", "--max-model-len", "2048", "--sim-seed", "5", "--sim-speedup",
            "50"]
    runs = []
    for _ in range(2):
        server = sim_server.start(args)
        runs.append(httpx.get(server.url + "/version", timeout=5).json()["simulator"]["run"])
        _stop(server, sim_state)
    assert runs == [0, 1]


def test_offload_bound_leaves_room_for_the_pinned_copy() -> None:
    from autotuner.tuner.space import offload_limit_gib

    sc = scenario(**{"engine.model": "llama-2-13b", "engine.flags": {"tensor-parallel-size": 2}})
    # Half of 64 GiB available, ~1.9 GiB pinned per GiB offloaded on each of 2 GPUs: 8 GiB, not 16.
    assert offload_limit_gib(sc, host_bytes=64 << 30) == 8.0


def test_an_offload_the_host_cannot_pin_is_not_launched() -> None:
    from autotuner.tuner.host_ram import host_ram_problem

    sc = scenario(**{"engine.kind": "vllm", "engine.model": "some/model", "engine.flags": {"tensor-parallel-size": 2}})
    assert host_ram_problem(sc, {OFFLOAD: 8}, available=40 << 30) is None  # 8 × 1.9 × 2 = 30.4 GiB fits
    problem = host_ram_problem(sc, {OFFLOAD: 12}, available=40 << 30)  # 45.6 GiB does not
    assert problem is not None and "45.6 GiB" in problem and "40.0 GiB is available" in problem
    assert host_ram_problem(sc, {OFFLOAD: 0}, available=0) is None
