"""The fault cases' scenarios and checks: the quickstart case on the simulator shrunk to seconds a trial,
a scenario for the misbehaving engine (tests/faults/fault_engine.py), the checks a case ends with (every
process the engine's log names is gone, the registry is empty, the trial is in Optuna's table and ours),
and the `tune` command line a case runs. They are plain functions rather than conftest contents so that
the fault test modules import them by name, as any other helper of the suite."""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path

import psutil
import yaml

from autotuner.engine.registry import group_members
from tests.support.quickstart import set_path

ROOT = Path(__file__).parent.parent.parent
FAULT_ENGINE = ROOT / "tests" / "faults" / "fault_engine.py"
_PID = re.compile(r"\((?:APIServer|EngineCore[\w-]*|Worker[\w-]*) pid=(\d+)\)")


def sim_scenario(tmp_path: Path, name: str = "sim", **changes: object) -> Path:
    """The quickstart case on the simulator, shrunk to a few seconds per trial."""
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["sim"]["speedup"] = 20
    data["engine"]["startup_timeout_s"] = 30
    data["engine"]["stop_grace_s"] = 5
    data["engine"]["release_timeout_s"] = 10
    data["workload"]["requests"].update(count=6, output_tokens=32)
    data["workload"]["request_timeout_s"] = 30
    # Safe flags on the quickstart box (the defaults hit the OOM wall): a fault is the only failure.
    # (The search stays in budgets the memory model lets through: an offload-only space would be skipped as
    # "offload not needed" and end with no engine run to kill.)
    data["engine"]["flags"].update({"gpu-memory-utilization": 0.8})
    data["search_space"] = {"max-num-batched-tokens": {"type": "int", "low": 512, "high": 1024}}
    for dotted, value in changes.items():
        set_path(data, dotted, value)
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def fault_scenario(tmp_path: Path, mode: str, name: str | None = None, **changes: object) -> Path:
    """An engine that behaves like `vllm serve` and misbehaves as `mode` says (see fault_engine.py)."""
    data: dict = {
        "name": f"fault-{mode}",
        "engine": {
            "kind": "vllm", "command": [sys.executable, str(FAULT_ENGINE)], "model": "fault-model",
            "served_model_name": "fault-model",
            "env": {"FAULT_MODE": mode, "FAULT_DIR": str(tmp_path / "fault")},
            "startup_timeout_s": 20, "stop_grace_s": 3, "release_timeout_s": 1,
        },
        "monitor": {"kind": "host", "hz": 50},
        "workload": {"requests": {"count": 6, "prompt_tokens": 64, "output_tokens": 16},
                     "arrivals": {"kind": "concurrency", "concurrency": 3}, "warmup_requests": 1,
                     "request_timeout_s": 3},
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 4096, "log": True}},
        "storage": f"sqlite:///{tmp_path / 'faults.db'}",
    }
    for dotted, value in changes.items():
        set_path(data, dotted, value)
    out = tmp_path / f"{name or mode}.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def engine_pids(log_path: str | Path) -> set[int]:
    """Every process the engine's log names (API server, engine core, workers)."""
    text = Path(log_path).read_text(errors="replace") if Path(log_path).is_file() else ""
    return {int(p) for p in _PID.findall(text)}


def assert_engine_gone(log_path: str | Path, started_after: float = 0.0) -> None:
    """No process the engine's log names is alive (as the process it was: a reused pid is not it),
    and no process group led by one of them has members. `started_after` is on `proc_identity.clock`."""
    pids = engine_pids(log_path)
    assert pids, f"the engine log {log_path} names no process"
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            alive = proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() >= started_after - 2
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"engine process {pid} is still running"
        assert not group_members(pid, not_before=started_after or None), f"process group {pid} has members"


def processes_of_home(home: Path) -> list[str]:
    """Live processes started with `AUTOTUNER_HOME=home` in their environment: every engine and worker a
    tuner of that home spawned carries it, whether or not it ever reached the registry."""
    found = []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("AUTOTUNER_HOME") == str(home):
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return found


def registry_empty(home: Path) -> bool:
    engines = home / "engines"
    return not engines.is_dir() or not list(engines.glob("*.json"))


def our_trials(db: Path) -> list[tuple[int, str, str]]:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return conn.execute("select trial_number, outcome, state from at_trials order by trial_number").fetchall()
        except sqlite3.OperationalError:
            return []


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
