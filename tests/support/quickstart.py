"""The quickstart scenario (scenarios/quickstart.yaml) made to order for the tuner tests: `quickstart` writes
it with dotted `a__b` changes (virtual time by default), `virtual_tuner` opens a Tuner over it in virtual time,
`scenario` writes the small real-process version (the simulator at speed-up 20, 8 requests of 32 tokens),
`tune_cmd` is the `autotuner tune` command line a test runs as a process and `completed` reads Optuna's own
trial table. Several tuner test modules build on these, so they live here rather than in test_study.py and
test_trial.py."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import yaml

from autotuner.scenario import load_scenario
from autotuner.store.db import Store
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner

ROOT = Path(__file__).parent.parent.parent


def set_path(data: dict, dotted: str, value: object) -> None:
    """Set `a__b__c` in nested scenario data (keyword arguments cannot hold dots)."""
    node = data
    *path, last = dotted.split("__")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def quickstart(tmp_path: Path, kind: str = "sim-virtual", **changes: object) -> Path:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["kind"] = kind
    for dotted, value in changes.items():
        set_path(data, dotted, value)
    out = tmp_path / f"{kind}.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def virtual_tuner(tmp_path: Path, trials: int, seed: int = 3, **changes: object) -> tuple[Tuner, Store]:
    scenario = load_scenario(quickstart(tmp_path, **changes))
    store = Store(str(tmp_path / "study.db"))
    return Tuner(scenario, VirtualRunner(scenario), store, n_trials=trials, seed=seed), store


def scenario(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["sim"]["speedup"] = 20
    data["workload"]["requests"]["count"] = 8
    data["workload"]["requests"]["output_tokens"] = 32
    for dotted, value in changes.items():
        set_path(data, dotted, value)
    out = tmp_path / "scenario.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def tune_cmd(path: Path, db: Path, *extra: str) -> list[str]:
    # --confirm 0: these tests are about the search loop; tests/trust covers what follows it.
    return [sys.executable, "-m", "autotuner", "tune", str(path), "--storage", str(db), "--confirm", "0", *extra]


def optuna_trials(db: Path) -> list[tuple[int, str]]:
    """Optuna's own trial table, read directly (its names: trials.number, trials.state)."""
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return conn.execute("select number, state from trials order by number").fetchall()
        except sqlite3.OperationalError:  # tables not created yet
            return []
