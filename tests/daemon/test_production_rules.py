"""The rules production-first rests on, one by one (no processes): fitting a restart to free memory, the
emergency token budget, the known-good chain's order, refusals and their backoff, the downtime plan."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from autotuner.daemon.config import DaemonConfigError, load_config
from autotuner.daemon.cycle import CycleDriver
from autotuner.daemon.drain import drain_plan
from autotuner.daemon.keeper import FreeMemory, NotServingError, fit_to_free, mitigated
from autotuner.daemon.known_good import KnownGoodChain
from autotuner.daemon.refusals import Refusals, backoff_s
from autotuner.daemon.state import CycleStore
from autotuner.deploy import make_target
from autotuner.store.db import Store
from tests.support.daemon import SCENARIO

GIB = 2**30


def test_a_restart_is_fitted_to_what_other_processes_left_free() -> None:
    flags = {"gpu-memory-utilization": 0.92, "max-num-batched-tokens": 2048}
    fitted, note = fit_to_free(flags, FreeMemory(24 * GIB, int(21.6 * GIB)))
    assert fitted == {"gpu-memory-utilization": 0.89, "max-num-batched-tokens": 2048}
    assert note is not None and "0.92 → 0.89" in note
    assert fit_to_free(flags, FreeMemory(24 * GIB, 24 * GIB)) == (flags, None)  # fits: untouched
    assert fit_to_free(flags, None) == (flags, None)  # no NVML: nothing to fit to
    with pytest.raises(NotServingError, match="not enough"):
        fit_to_free(flags, FreeMemory(24 * GIB, 4 * GIB))
    # vLLM's default utilization when the flag is not set.
    assert fit_to_free({}, FreeMemory(24 * GIB, 12 * GIB))[0] == {"gpu-memory-utilization": 0.49}


def test_the_emergency_budget_goes_below_the_crashing_step() -> None:
    assert mitigated({"max-num-batched-tokens": 8192}, 7796) == {"max-num-batched-tokens": 3888}
    assert mitigated({"max-num-batched-tokens": 4096}, None) == {"max-num-batched-tokens": 2048}
    assert mitigated({"max-num-batched-tokens": 256}, 300) is None  # cannot go lower
    assert mitigated({}, 5000) == {"max-num-batched-tokens": 2496}


def test_chain_is_newest_verified_first_per_box_and_forgets_an_oomed_config(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db.sqlite"))
    chain = KnownGoodChain(store, "prod")
    a, b = {"max-num-batched-tokens": 512}, {"max-num-batched-tokens": 1024}
    chain.record(a, "box1", "adopted")
    time.sleep(0.01)
    chain.record(b, "box1", "deployed", {"headroom_gib": [2.0]})
    chain.record({"x": 1}, "box2", "adopted")
    assert [k.flags for k in chain.chain("box1")] == [b, a]
    time.sleep(0.01)
    chain.record(a, "box1", "restored")  # verified again: to the front
    assert [k.flags for k in chain.chain("box1")] == [a, b]
    assert chain.chain("box1")[1].headroom_gib == 2.0
    chain.forget(a, "box1")
    assert [k.flags for k in chain.chain("box1")] == [b]


def test_refusals_count_per_fingerprint_and_failures_back_off(tmp_path: Path) -> None:
    refusals = Refusals(Store(str(tmp_path / "db.sqlite")), "prod")
    flags = {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.95}
    refusals.record("fp1", flags, "start", "engine died")
    refusals.record("fp1", dict(reversed(list(flags.items()))), "verify", "verify failed")  # same flags
    r = refusals.refused("fp1", flags)
    assert r is not None and r.count == 2 and r.kind == "verify"
    refusals.record("fp1", flags, "oom", "CUDA out of memory")
    refusals.record("fp1", flags, "start", "GPUs busy")  # a later failed start does not hide the OOM
    r = refusals.refused("fp1", flags)
    assert r is not None and r.count == 4 and (r.kind, r.reason) == ("oom", "CUDA out of memory")
    assert refusals.refused("fp2", flags) is None  # another box or workload
    assert refusals.total() == 1
    assert [backoff_s(3600, n) for n in range(4)] == [3600, 7200, 14400, 28800]
    assert backoff_s(0, 1) == 2.0 and backoff_s(3600, 50) == 7 * 86400.0


def _loaded(tmp_path: Path, **daemon: object):
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    (tmp_path / "config.yaml").write_text("max-model-len: 4096\n")
    config = {"scenario": "scenario.yaml", "storage": "db.sqlite", "production": {"endpoint": "http://127.0.0.1:1"},
              "deploy": {"kind": "file", "config_path": str(tmp_path / "config.yaml")}, **daemon}
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump(config))
    return load_config(tmp_path / "daemon.yaml")


def test_downtime_is_planned_to_fit_max_downtime(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, max_downtime="10m", tune={"timeout": "1h", "soak": "2m", "confirm": "2x2"})
    store = Store(str(tmp_path / "db.sqlite"))
    states = CycleStore(store, "prod")
    driver = CycleDriver(loaded, states, store, make_target(loaded.config.deploy), asyncio.Event(), tmp_path,
                         ctx=None)  # type: ignore[arg-type]
    cycle = states.begin("schedule", {}, {})
    assert driver._tune_time(cycle) == 3600  # production never taken down: only the tune's own timeout
    cycle.down_since = time.time() - 100
    assert abs(driver._tune_time(cycle) - (300 - 100)) < 2  # half of max_downtime, less what is spent
    # After a search of 4 runs in 200 s: 4 confirm runs of ~50 s and a restart leave 600-300-200-50 = 50 s:
    # the 120 s soak is shortened to fit, not skipped.
    cycle.down_since, cycle.trials = time.time() - 300, 4
    cycle.scenario = {"tune_started_at": time.time() - 200}
    soak = driver._soak_time(cycle, 2, 2)
    assert soak is not None and 30 <= soak <= 60, soak
    cycle.down_since = time.time() - 400  # too late: no soak fits, the cycle stops with production back
    assert driver._soak_time(cycle, 2, 2) is None


def test_a_file_target_without_stop_start_never_drains(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path)
    target = make_target(loaded.config.deploy)
    assert not target.can_take_down
    assert drain_plan(loaded.scenario, loaded.config, target)[0] is False  # virtual time: needs no GPU
    process = loaded.scenario.model_copy(update={"engine": loaded.scenario.engine.model_copy(update={"kind": "sim"})})
    drain, why = drain_plan(process, loaded.config, target)
    assert drain and "cannot take production down" in why
    with pytest.raises(DaemonConfigError, match="both stop and start"):
        _loaded(tmp_path, deploy={"kind": "file", "config_path": str(tmp_path / "config.yaml"), "stop": ["true"]})
    with pytest.raises(DaemonConfigError, match="max_downtime"):
        _loaded(tmp_path, max_downtime="0s")


def test_a_tune_uses_idle_gpus_beside_production_instead_of_a_drain(tmp_path: Path, monkeypatch) -> None:
    from autotuner.daemon.drain import spare_gpus
    from autotuner.sim.gpu_state import GpuHost, make_gpus

    state = tmp_path / "gpus"
    monkeypatch.setenv("AUTOTUNER_SIM_STATE_DIR", str(state))
    GpuHost(state).ensure_inventory(make_gpus(state, "NVIDIA GeForce RTX 3090", 24 * GIB, 8))
    loaded = _loaded(tmp_path, production={"endpoint": "http://127.0.0.1:1", "gpus": [0, 1, 2, 3]})
    engine = loaded.scenario.engine
    tp2 = loaded.scenario.model_copy(update={"engine": engine.model_copy(update={
        "kind": "sim", "flags": {**engine.flags, "tensor-parallel-size": 2}})})
    assert spare_gpus(tp2, [0, 1, 2, 3]) == [4, 5]
    assert spare_gpus(tp2, None) is None  # production's GPUs not named: nothing is known to be spare
    tp8 = tp2.model_copy(update={"engine": tp2.engine.model_copy(update={
        "flags": {**engine.flags, "tensor-parallel-size": 8}})})
    assert spare_gpus(tp8, [0, 1, 2, 3]) is None  # needs more than the 4 idle ones
    with_gpus = tp2.model_copy(update={"engine": tp2.engine.model_copy(update={"gpus": [6, 7]})})
    assert drain_plan(with_gpus, loaded.config, make_target(loaded.config.deploy))[0] is False
