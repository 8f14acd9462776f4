"""Trials side by side on disjoint GPU groups, on the simulator as real processes: a TP 2 model on 8
simulated GPUs runs 4 trials at once. What the GPUs held is read from the simulator's own GPU state (its
holder files, sampled while `tune` runs), never from what the tuner recorded about itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.engine.gpu_locks import GpuInUseError, GpuLocks
from autotuner.engine.registry import group_members
from autotuner.errors import UserInputError
from autotuner.proc_identity import same_start
from autotuner.scenario import load_scenario
from autotuner.sim.gpu_state import HOLDERS_DIR, release_delay_s
from autotuner.store.db import Store
from autotuner.tuner.budget import launched_trials
from autotuner.tuner.groups import WHOLE_BOX, GroupSlots, gpus_per_trial, parse_setting, plan_groups
from autotuner.tuner.lifecycle import RELEASE_TOLERANCE_BYTES
from tests.support.faults import processes_of_home
from tests.support.quickstart import optuna_trials, tune_cmd

MIB = 1 << 20


def tp2_on_8(tmp_path: Path, gpus: int = 8, trials: int = 8) -> Path:
    data = {
        "name": "groups",
        "engine": {"kind": "sim", "model": "llama-2-13b",
                   "flags": {"tensor-parallel-size": 2, "max-model-len": 4096},
                   "sim": {"gpu": "rtx-3090", "gpus": gpus, "speedup": 20, "noise": 0},
                   "startup_timeout_s": 60, "release_timeout_s": 20},
        "monitor": {"kind": "sim", "hz": 100},
        "workload": {"requests": {"count": 8, "prompt_tokens": {"kind": "uniform", "low": 1000, "high": 3000},
                                  "output_tokens": 32},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}, "warmup_requests": 1,
                     "max_duration_s": 60},
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 512, "high": 16384, "log": True},
                         "gpu-memory-utilization": {"type": "float", "low": 0.85, "high": 0.97, "step": 0.01}},
        "budget": {"trials": trials},
    }
    path = tmp_path / "tp2.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- planning (pure) -------------------------------------------------------------------------------------

def test_groups_are_disjoint_and_as_many_as_fit(tmp_path: Path) -> None:
    sc = load_scenario(tp2_on_8(tmp_path))
    groups = plan_groups(sc)
    assert [g.gpus for g in groups] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [g.gpus for g in plan_groups(sc, 2)] == [(0, 1), (2, 3)]
    assert plan_groups(sc, "off") == [WHOLE_BOX]
    with pytest.raises(UserInputError, match="room for 4 group"):
        plan_groups(sc, 5)
    # TP = the GPU count: one trial at a time, on the scenario's GPUs as they are.
    assert plan_groups(load_scenario(tp2_on_8(tmp_path, gpus=2))) == [WHOLE_BOX]
    assert plan_groups(sc, "auto", gpus=[3, 5, 7]) == [plan_groups(sc, "auto", gpus=[3, 5, 7])[0]]
    assert plan_groups(sc, "auto", gpus=[3, 5, 7])[0].gpus is None
    with pytest.raises(UserInputError, match="auto, off or a number"):
        parse_setting("many")


def test_a_searched_tensor_parallel_size_sizes_the_groups_for_its_largest(tmp_path: Path) -> None:
    data = yaml.safe_load(tp2_on_8(tmp_path).read_text())
    data["search_space"]["tensor-parallel-size"] = {"type": "categorical", "choices": [1, 2, 4]}
    path = tmp_path / "searched.yaml"
    path.write_text(yaml.safe_dump(data))
    sc = load_scenario(path)
    assert gpus_per_trial(sc) == 4
    assert [g.gpus for g in plan_groups(sc)] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_neighbours_are_the_trials_whose_engines_overlapped() -> None:
    slots = GroupSlots([WHOLE_BOX])
    slots.launching(1)
    slots.launching(2)
    assert slots.landed(1) == [2]
    slots.launching(3)
    assert slots.landed(2) == [1, 3]
    assert slots.landed(3) == [2]


def test_two_engines_of_one_process_never_lock_the_same_gpu(tmp_path: Path) -> None:
    study_hold = GpuLocks([(0, "GPU-a"), (1, "GPU-b")], lock_dir=tmp_path)
    study_hold.acquire()
    first = GpuLocks([(0, "GPU-a")], lock_dir=tmp_path, engine=True)
    first.acquire()  # inside the study's own hold: re-entrant
    with pytest.raises(GpuInUseError, match="two engines never share a GPU"):
        GpuLocks([(1, "GPU-b"), (0, "GPU-a")], lock_dir=tmp_path, engine=True).acquire()
    GpuLocks([(1, "GPU-b")], lock_dir=tmp_path, engine=True).acquire()  # all-or-none: GPU-b was not kept
    first.release()
    again = GpuLocks([(0, "GPU-a")], lock_dir=tmp_path, engine=True)
    again.acquire()
    again.release()
    study_hold.release()


# --- on the simulator -------------------------------------------------------------------------------------

@dataclass
class Engine:
    port: int | None
    gpus: set[int] = field(default_factory=set)
    peak: dict[int, int] = field(default_factory=dict)  # per GPU, as the simulated worker says it held


class GpuWatch(threading.Thread):
    """Samples the simulated GPUs' holder files: which engine (the worker's session) holds which GPU."""

    def __init__(self, state: Path) -> None:
        super().__init__(daemon=True)
        self.holders = state / HOLDERS_DIR
        self.stop = threading.Event()
        self.engines: dict[int, Engine] = {}  # session id -> engine
        self.sid_of: dict[tuple[int, float], int] = {}  # (pid, start time) -> session
        self.shared: list[str] = []  # samples where two engines held one GPU
        self.most_at_once = 0
        self.samples = 0

    def _session(self, key: tuple[int, float]) -> int | None:
        if key not in self.sid_of:
            try:
                sid = os.getsid(key[0])
                cmdline = Path(f"/proc/{sid}/cmdline").read_bytes().split(b"\0")
            except (OSError, ProcessLookupError):
                return None
            port = int(cmdline[cmdline.index(b"--port") + 1]) if b"--port" in cmdline else None
            self.sid_of[key] = sid
            self.engines.setdefault(sid, Engine(port))
        return self.sid_of[key]

    def run(self) -> None:
        while not self.stop.is_set():
            on_gpu: dict[int, set[int]] = defaultdict(set)
            try:
                entries = list(os.scandir(self.holders))
            except FileNotFoundError:
                entries = []
            now = time.time()
            for entry in entries:
                try:
                    mtime = entry.stat().st_mtime
                    raw = json.loads(Path(entry.path).read_bytes())
                except (OSError, ValueError):
                    continue
                # A worker is known by its pid and start time: under the suite's load pids wrap (pid_max
                # 32768), and a reused pid is another engine's worker.
                key = (int(raw["pid"]), float(raw["create_time"]))
                running = _running(*key)
                # A worker that has exited leaves its file, and its last peak, for the release delay; its
                # engine was learnt while it ran. The peak still counts (an engine stopped right after its
                # peak); the GPU counts as held only while the simulator counts the memory as held and more
                # of it than the tuner's release check lets through (lifecycle.py).
                sid = self._session(key) if running else self.sid_of.get(key)
                if sid is None or not raw["bytes"]:
                    continue
                gpu = int(raw["gpu"])
                engine = self.engines[sid]
                engine.gpus.add(gpu)
                engine.peak[gpu] = max(engine.peak.get(gpu, 0), int(raw.get("peak_bytes", raw["bytes"])))
                if running or (now - mtime < release_delay_s() and int(raw["bytes"]) > RELEASE_TOLERANCE_BYTES):
                    on_gpu[gpu].add(sid)
            self.samples += 1
            self.shared += [f"GPU {gpu}: engines {sorted(s)}" for gpu, s in on_gpu.items() if len(s) > 1]
            self.most_at_once = max(self.most_at_once, len(set().union(*on_gpu.values())) if on_gpu else 0)
            time.sleep(0.02)


def _running(pid: int, born: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return same_start(proc.create_time(), born) and \
            proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


@pytest.fixture
def env(tmp_path: Path, sim_state: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return dict(os.environ)


def only_study(store: Store) -> optuna.Study:
    storage = store.optuna_storage()
    (name,) = optuna.get_all_study_names(storage=storage)
    return optuna.load_study(study_name=name, storage=storage)


def tune_watched(path: Path, db: Path, env: dict[str, str],
                 sim_state: Path) -> tuple[subprocess.CompletedProcess[str], GpuWatch]:
    """`autotuner tune` run to its end while a GpuWatch samples which engine holds which GPU."""
    watch = GpuWatch(sim_state)
    watch.start()
    try:
        done = subprocess.run(tune_cmd(path, db), env=env, capture_output=True, text=True, timeout=600)
    finally:
        watch.stop.set()
        watch.join()
    return done, watch


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


def test_tp2_on_8_gpus_runs_4_trials_at_once_each_on_its_own_gpus(tmp_path: Path, sim_state: Path,
                                                                   env: dict[str, str]) -> None:
    path, db = tp2_on_8(tmp_path), tmp_path / "g.db"
    done, watch = tune_watched(path, db, env, sim_state)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trials side by side on 4 GPU groups: 0,1 | 2,3 | 4,5 | 6,7" in done.stdout
    assert watch.samples > 50
    assert not watch.shared, watch.shared[:5]
    assert watch.most_at_once == 4, "4 engines at once, one per group"

    store = Store(str(db))
    study = only_study(store)
    launched = launched_trials(study)
    assert len(launched) == 8
    rows = {r.trial_number: r for r in store.trials(study.study_name)}
    by_port = {e.port: e for e in watch.engines.values()}
    checked = 0
    for t in launched:
        group = t.user_attrs["gpu_group"]
        assert group in ([0, 1], [2, 3], [4, 5], [6, 7])
        result = rows[t.number].result
        engine = by_port[_port(result["argv"])]
        assert sorted(engine.gpus) == group, "the engine ran on its trial's group, nowhere else"
        memory = result["memory"]
        assert memory["devices"] == group, "its monitor watched its own GPUs only"
        for gpu, seen in zip(group, memory["peak_bytes"], strict=True):
            # What the trial recorded is its own engine's memory: never a neighbour's on top of it...
            assert seen <= engine.peak[gpu] + 64 * MIB, (t.number, gpu, seen, engine.peak[gpu])
            if t.user_attrs["outcome"] == "ok":
                # ...and not an idle GPU's (transients shorter than a sample may be missed).
                assert seen >= 0.9 * engine.peak[gpu], (t.number, gpu, seen, engine.peak[gpu])
        checked += 1
        for other in t.user_attrs["neighbours"]:
            assert t.number in study.trials[other].user_attrs["neighbours"]
    assert checked == 8
    assert sum(1 for t in launched if t.user_attrs["neighbours"]) >= 6


def test_sigkill_mid_way_resumes_every_group(tmp_path: Path, sim_state: Path, env: dict[str, str]) -> None:
    path, db = tp2_on_8(tmp_path), tmp_path / "k.db"
    engines = tmp_path / "home" / "engines"
    proc = subprocess.Popen(tune_cmd(path, db), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if engines.is_dir() and len(list(engines.glob("*.json"))) >= 3:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"never 3 engines at once within 180 s; trials: {optuna_trials(db)}")
    pgids = [int(p.stem) for p in engines.glob("*.json")]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    in_flight = [n for n, state in optuna_trials(db) if state == "RUNNING"]
    assert len(in_flight) >= 3, optuna_trials(db)
    assert any(group_members(p) for p in pgids), "the killed tuner left its engines running (to be reaped)"

    done = subprocess.run(tune_cmd(path, db), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for pgid in pgids:
        assert not group_members(pgid), f"orphan engine group {pgid} still alive"
    assert not list(engines.glob("*.json")), "engine registry not emptied"
    # Also the engine the killed tuner was spawning, on no record but its launch announcement.
    assert not processes_of_home(tmp_path / "home"), "an engine of the killed tuner outlived the resume"
    study = only_study(Store(str(db)))
    assert not study.get_trials(states=(TrialState.RUNNING,))
    requeued = {t.user_attrs.get("requeued_from") for t in study.trials}
    for number in in_flight:
        t = study.trials[number]
        assert t.state == TrialState.FAIL and t.user_attrs["outcome"] == "interrupted"
        # A trial killed while asking has no parameters yet: nothing to measure again.
        assert number in requeued or not t.params, f"trial {number} was in flight and not measured again"
    assert sum(1 for n in in_flight if study.trials[n].params) >= 3
    assert len(launched_trials(study)) == 8
    # Locks went with the killed process: the resumed run used every group.
    groups = {tuple(t.user_attrs["gpu_group"]) for t in launched_trials(study) if "gpu_group" in t.user_attrs}
    assert groups == {(0, 1), (2, 3), (4, 5), (6, 7)}


def test_more_groups_than_fit_is_bad_input(tmp_path: Path, env: dict[str, str]) -> None:
    done = subprocess.run([*tune_cmd(tp2_on_8(tmp_path), tmp_path / "b.db"), "--gpu-groups", "5"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "room for 4 group(s)" in done.stderr
    assert not (tmp_path / "b.db").exists()


def test_tp_equal_to_the_gpu_count_runs_one_trial_at_a_time(tmp_path: Path, sim_state: Path,
                                                            env: dict[str, str]) -> None:
    path, db = tp2_on_8(tmp_path, gpus=2, trials=3), tmp_path / "o.db"
    done, watch = tune_watched(path, db, env, sim_state)
    assert done.returncode == 0, done.stderr[-3000:]
    assert watch.most_at_once == 1 and len(watch.engines) >= 2
    assert "side by side" not in done.stdout
    study = only_study(Store(str(db)))
    assert all("gpu_group" not in t.user_attrs for t in study.trials)


def test_sigterm_stops_every_group_and_queues_each_trial_again(tmp_path: Path, env: dict[str, str]) -> None:
    path, db = tp2_on_8(tmp_path), tmp_path / "t.db"
    engines = tmp_path / "home" / "engines"
    proc = subprocess.Popen(tune_cmd(path, db), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (engines.is_dir() and len(list(engines.glob("*.json"))) >= 3):
        time.sleep(0.05)
    pgids = [int(p.stem) for p in engines.glob("*.json")] if engines.is_dir() else []
    if len(pgids) < 3:
        proc.kill()
        pytest.fail(f"never 3 engines at once within 180 s; trials: {optuna_trials(db)}")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted" in out
    for pgid in pgids:
        assert not group_members(pgid), f"engine group {pgid} still alive after SIGTERM"
    study = only_study(Store(str(db)))
    assert not study.get_trials(states=(TrialState.RUNNING,))
    stopped = [t for t in study.trials if t.user_attrs.get("outcome") == "interrupted"]
    assert len([t for t in stopped if t.params]) >= 3
    waiting = {t.user_attrs.get("requeued_from") for t in study.get_trials(states=(TrialState.WAITING,))}
    assert {t.number for t in stopped if t.params} <= waiting
