"""The study loop: in virtual time (fast, deterministic) and on the simulator as real processes
(resume after SIGKILL, SIGTERM), plus the bad inputs `tune` must refuse."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.engine.registry import group_members
from autotuner.scenario import Scenario, load_scenario
from autotuner.store.db import Store
from autotuner.trials.scoring import CONSTRAINT_KEYS
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.memory_model import PRIOR_MEAN
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner
from tests.support.quickstart import optuna_trials, quickstart, tune_cmd, virtual_tuner

ROOT = Path(__file__).parent.parent.parent


def test_virtual_loop_records_every_trial_with_the_same_constraints(tmp_path: Path) -> None:
    tuner, store = virtual_tuner(tmp_path, 12)
    summary = asyncio.run(tuner.run())
    assert summary.trials_done == 12 and not summary.interrupted
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(launched_trials(study)) == 12  # the budget counts engine runs; rejected candidates are extra
    assert trials[0].user_attrs["kind"] == "baseline"
    assert [t.user_attrs["kind"] for t in trials[1:3]] == ["probe", "probe"]
    # The memory model pins the wall at the top and the bottom of the utilization range, under the wall
    # it fitted from the baseline: neither runs out of memory (one may be pruned as slow).
    assert {t.params["gpu-memory-utilization"] for t in trials[1:3]} <= {0.95, 0.85}
    assert trials[1].params != trials[2].params
    assert all(t.user_attrs["outcome"] in ("ok", "pruned") for t in trials[1:3])
    assert trials[0].params == {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.92, "cpu-offload-gb": 0.0}
    # The evidence-based wall (autotuner/sim/memory.py): vLLM's defaults serve these long prompts; the
    # quickstart's space reaches past the wall, where trials die.
    assert trials[0].user_attrs["outcome"] == "ok"
    for t in trials:
        assert set(t.user_attrs["constraints"]) == set(CONSTRAINT_KEYS)
        assert set(t.system_attrs) >= {f"constraints:{k}" for k in CONSTRAINT_KEYS}
        assert t.user_attrs["feasible"] == all(v <= 0 for v in t.user_attrs["constraints"].values())
    rows = store.trials(tuner.study_name)
    assert [r.trial_number for r in rows] == [t.number for t in trials]
    assert rows[0].kind == "baseline" and rows[0].outcome == trials[0].user_attrs["outcome"]
    feasible = [t for t in trials if t.user_attrs["feasible"]]
    assert feasible, "12 trials find at least one config that holds"
    assert summary.best and all(b["number"] in {t.number for t in feasible} for b in summary.best)
    key = store.study(tuner.study_name)
    assert key is not None and key.key.gpu_inventory == ["NVIDIA GeForce RTX 3090 (23.69 GiB, simulated)"] * 8
    # Running again continues the same study to its study-wide budget: nothing more to do.
    again, _ = virtual_tuner(tmp_path, 12)
    assert asyncio.run(again.run()).trials_done == 12
    assert len(store.trials(tuner.study_name)) == len(trials)


def test_flag_rules_are_checked_before_launch(tmp_path: Path) -> None:
    space = {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 512},
             "max-num-seqs": {"type": "int", "low": 128, "high": 1024, "log": True}}
    tuner, store = virtual_tuner(tmp_path, 8, search_space=space)
    asyncio.run(tuner.run())
    invalid = [r for r in store.trials(tuner.study_name) if r.outcome == "invalid-flags"]
    assert invalid
    for r in invalid:
        assert "must be greater than or equal to max_num_seqs" in (r.reason or "")
        assert r.result["argv"] == []  # never launched


@pytest.fixture
def sim_env(tmp_path: Path, sim_state: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return dict(os.environ)


def not_launched(db: Path) -> set[int]:
    """Numbers of the trials recorded as never launched (ruled out before an engine started)."""
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute("select t.number from trials t join trial_user_attributes a on a.trial_id = t.trial_id "
                            "where a.key = 'launched' and a.value_json = 'false'").fetchall()
    return {n for (n,) in rows}


def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path: Path, sim_env: dict[str, str]) -> None:
    path = quickstart(tmp_path, kind="sim", engine__sim__speedup=20, workload__requests__count=6,
                      workload__requests__output_tokens=32)
    db = tmp_path / "q.db"
    proc = subprocess.Popen(tune_cmd(path, db, "--trials", "5"), env=sim_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    engines = tmp_path / "home" / "engines"
    # Kill the tuner while an engine of its third trial is up.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = optuna_trials(db)
        if len([s for _, s in states if s == "COMPLETE"]) >= 2 and engines.is_dir() and list(engines.glob("*.json")):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"no engine of a third trial within 120 s; trials so far: {optuna_trials(db)}")
    pgids = [int(p.stem) for p in engines.glob("*.json")]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = optuna_trials(db)
    assert pgids and group_members(pgids[0]), "the killed tuner left its engine running (to be reaped)"
    done = subprocess.run(tune_cmd(path, db, "--trials", "5"), env=sim_env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    for pgid in pgids:
        assert not group_members(pgid), "the orphaned engine was stopped"
    after = optuna_trials(db)
    # The budget counts engine runs: candidates the memory model ruled out (never launched) come on top.
    assert [s for n, s in after if n not in not_launched(db)].count("COMPLETE") == 5
    assert "RUNNING" not in [s for _, s in after]
    # Every trial COMPLETE before the kill is still there, unchanged.
    for number, state in before:
        if state == "COMPLETE":
            assert (number, "COMPLETE") in after
    store = Store(str(db))
    name = store.studies()[0].study_name
    rows = store.trials(name)
    numbers = [r.trial_number for r in rows]
    assert len(numbers) == len(set(numbers))
    assert sorted(r.trial_number for r in rows if r.state == "COMPLETE") == \
        [n for n, s in after if s == "COMPLETE"]


def test_sigterm_stops_the_engine_and_exits_0(tmp_path: Path, sim_env: dict[str, str]) -> None:
    path = quickstart(tmp_path, kind="sim", engine__sim__speedup=2, workload__requests__count=32)
    db = tmp_path / "t.db"
    proc = subprocess.Popen(tune_cmd(path, db, "--trials", "3"), env=sim_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    engines = tmp_path / "home" / "engines"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (engines.is_dir() and list(engines.glob("*.json"))):
        time.sleep(0.1)
    pgids = [int(p.stem) for p in engines.glob("*.json")]
    assert pgids
    time.sleep(2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert time.monotonic() - t0 < 30
    assert "interrupted" in out
    assert not group_members(pgids[0])
    store = Store(str(db))
    rows = store.trials(store.studies()[0].study_name)
    assert rows[-1].outcome == "interrupted"


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    def tune(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autotuner", "tune", *args], capture_output=True, text=True,
                              timeout=60)

    broken = tmp_path / "broken.yaml"
    broken.write_text("engine: [not, a, mapping]\n")
    done = tune(str(broken))
    assert done.returncode == 2 and "engine" in done.stderr
    empty = quickstart(tmp_path, search_space={})
    done = tune(str(empty), "--storage", str(tmp_path / "e.db"))
    assert done.returncode == 2 and "search_space is empty" in done.stderr
    assert not (tmp_path / "e.db").exists(), "bad input writes nothing"
    good = quickstart(tmp_path)
    done = tune(str(good), "--storage", str(tmp_path / "no" / "such" / "dir" / "x.db"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    done = tune(str(good), "--storage", "postgresql://tuner@127.0.0.1:1/nodb")
    assert done.returncode == 2 and "storage" in done.stderr
    done = tune(str(good), "--storage", str(tmp_path / "x.db"), "--timeout", "soon")
    assert done.returncode == 2 and "expected e.g. 8h" in done.stderr


def test_scenario_model_is_expanded_and_env_kept_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MODEL_NAME", "llama-2-13b")
    monkeypatch.setenv("TEST_HF_TOKEN", "hf_canary_value_123")
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["model"] = "${TEST_MODEL_NAME}"
    data["engine"]["env"]["HF_TOKEN"] = "${TEST_HF_TOKEN}"
    sc = Scenario.model_validate(data)
    assert sc.engine.model == "llama-2-13b"
    assert sc.engine.resolved_env()["HF_TOKEN"] == "hf_canary_value_123"  # what the engine gets
    assert sc.model_dump(mode="json")["engine"]["env"]["HF_TOKEN"] == "${TEST_HF_TOKEN}"  # what is stored
    monkeypatch.delenv("TEST_MODEL_NAME")
    with pytest.raises(ValueError, match=r"uses \$\{TEST_MODEL_NAME\}, which is not set"):
        Scenario.model_validate(data)


def test_model_swap_opens_a_new_study_warm_started_from_the_old(tmp_path: Path) -> None:
    first, store = virtual_tuner(tmp_path, 10)
    asyncio.run(first.run())
    swapped = load_scenario(quickstart(tmp_path, engine__model="llama-2-7b"))
    with pytest.raises(Exception, match="was tuned for another setup"):
        Tuner(swapped, VirtualRunner(swapped), store, study_name=first.study_name, n_trials=4)._open_study()
    second = Tuner(swapped, VirtualRunner(swapped), store, n_trials=6, seed=1, warm_start=first.study_name)
    assert second.study_name != first.study_name
    asyncio.run(second.run())
    # The old study's fitted memory wall, rescaled to the 7B model, is the new study's prior.
    assert second.memory.prior_mean.tolist() != PRIOR_MEAN.tolist()
    kinds = [r.kind for r in store.trials(second.study_name)]
    assert kinds[0] == "baseline"
    assert "warm-start" in kinds
    old_best = {tuple(sorted(b["params"].items())) for b in first._summary(
        optuna.load_study(study_name=first.study_name, storage=store.optuna_storage()), "", False).best}
    warm = [tuple(sorted((k, v) for k, v in r.flags.items() if k in dict(next(iter(old_best)))))
            for r in store.trials(second.study_name) if r.kind == "warm-start"]
    assert set(warm) <= old_best


def test_a_twin_first_model_swap_keeps_the_boxs_calibration_as_its_twins_prior(tmp_path: Path) -> None:
    """The default of `tune` and the daemon: after a swap, the new model's twin starts from this box's
    calibration on the old study's trials instead of replaying the old model's configs."""
    scenario = load_scenario(quickstart(tmp_path))
    store = Store(str(tmp_path / "study.db"))
    first = Tuner(scenario, VirtualRunner(scenario), store, n_trials=6, seed=3, twin=True)
    asyncio.run(first.run())
    swapped = load_scenario(quickstart(tmp_path, engine__model="llama-2-7b"))
    second = Tuner(swapped, VirtualRunner(swapped), store, n_trials=4, seed=1, warm_start=first.study_name, twin=True)
    asyncio.run(second.run())
    measured = [r for r in store.trials(first.study_name) if r.outcome == "ok"]
    assert second.guide.prior.fitted_on >= len(measured) > 0
    kinds = [r.kind for r in store.trials(second.study_name)]
    assert kinds[0] == "baseline" and "twin" in kinds and "warm-start" not in kinds
