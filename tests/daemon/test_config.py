"""The daemon's config file: validated like a scenario (file:line: field, exit 2), windows and durations."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from autotuner.daemon.config import DaemonConfigError, Window, duration_s, load_config
from tests.support.daemon import SCENARIO

GOOD = {
    "scenario": "scenario.yaml",
    "production": {"endpoint": "http://127.0.0.1:8000", "api_key_env": "VLLM_API_KEY"},
    "deploy": {"kind": "file", "config_path": "tuned.yaml"},
    "triggers": {"poll_interval_s": 30, "workload_drift": {"p95_ratio": 1.5, "window_s": "2h", "min_requests": 50},
                 "schedule": {"every": "7d"}},
    "window": "22:00-04:00",
    "min_interval_s": "1h",
    "tune": {"trials": 10, "timeout": "90m", "confirm": "2x3", "soak": "5m"},
}


def write(tmp_path: Path, config: dict, text: str | None = None) -> Path:
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    path = tmp_path / "daemon.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_good_config_loads_with_its_scenario(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, GOOD))
    c = loaded.config
    assert loaded.scenario.name == "prod"
    assert c.min_interval_s == 3600 and c.triggers.schedule is not None and c.triggers.schedule.every == 7 * 86400
    assert c.triggers.workload_drift is not None and c.triggers.workload_drift.window_s == 7200
    assert c.tune.timeout_s == 5400 and c.tune.soak_s == 300
    assert c.listen.host == "127.0.0.1"
    assert c.storage_url().endswith("autotuner.db")


@pytest.mark.parametrize(("change", "key", "needle"), [
    ({"window": "25:00-06:00"}, "window", "window: window '25:00-06:00': hours 0-23"),
    ({"tune": {"confirm": "0"}}, "confirm", "tune.confirm: confirm 0 would deploy an unconfirmed winner"),
    ({"production": {"endpoint": "localhost:8000"}}, "endpoint", "production.endpoint"),
    ({"triggers": {"poll_interval_s": "soon"}}, "poll_interval_s", "triggers.poll_interval_s: duration 'soon'"),
    ({"listen": {"token": "s3cret"}}, "token", "listen.token: unknown field"),
    ({"deploy": {"kind": "command", "config_path": "tuned.yaml", "start": "vllm serve m"}}, "start",
     "deploy.start: 'vllm serve m' is a string; give an argv list"),
])
def test_a_bad_field_is_named_with_its_file_and_line(tmp_path: Path, change: dict, key: str, needle: str) -> None:
    path = write(tmp_path, {**GOOD, "listen": {"port": 8765}, **change})
    line = 1 + next(i for i, text in enumerate(path.read_text().splitlines()) if text.strip().startswith(f"{key}:"))
    with pytest.raises(DaemonConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and needle in str(err.value), str(err.value)


def test_the_cli_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "storage": "state.db", "tune": {"policy": "fastest"}})
    out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "run", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert f"{path}:" in out.stderr and "tune.policy" in out.stderr and "max-throughput" in out.stderr
    assert not (tmp_path / "state.db").exists()
    missing = write(tmp_path, {**GOOD, "scenario": "nope.yaml"})
    out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "status", str(missing)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "no such scenario file" in out.stderr


def test_a_taken_listen_port_is_bad_input(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write(tmp_path, {**GOOD, "window": None, "listen": {"port": port}})
        out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "run", str(path)], capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 2
    assert f"listen 127.0.0.1:{port}: cannot bind" in out.stderr and "Traceback" not in out.stderr


def test_windows_cross_midnight_and_say_how_long_is_left() -> None:
    w = Window.parse("22:00-04:00")
    assert w.contains(datetime(2026, 1, 1, 23, 0)) and w.contains(datetime(2026, 1, 2, 3, 59))
    assert not w.contains(datetime(2026, 1, 1, 12, 0))
    assert w.seconds_left(datetime(2026, 1, 1, 23, 0)) == 5 * 3600
    assert w.next_open(datetime(2026, 1, 1, 12, 0)) == datetime(2026, 1, 1, 22, 0)
    assert Window.parse("01:00:30-01:00:45").seconds_left(datetime(2026, 1, 1, 1, 0, 40)) == 5
    with pytest.raises(ValueError, match="same time"):
        Window.parse("01:00-01:00")
    assert duration_s("1h30m") == 5400 and duration_s(12) == 12.0
