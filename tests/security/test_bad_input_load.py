"""Issue 23's bad input, each item refused at load as one `error:` line, exit 2, nothing written: what the
adversarial review found as tracebacks, wrongly accepted values, a wrongly refused trace, and exit 2 with a file
written. The scenario items go through `load_scenario` (what every command calls first); the ones whose harm
was a file written go through the CLI as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.daemon.config import DaemonConfigError, duration_s, load_config
from autotuner.durations import parse_duration
from autotuner.engine.launch import parse_set
from autotuner.errors import UserInputError, quoted
from autotuner.scenario import load_scenario
from autotuner.workload.trace import load_trace

BASE: dict[str, Any] = {"name": "sec", "engine": {"kind": "sim-virtual", "model": "llama-2-7b"}}


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, text: str, says: str) -> str:
    with pytest.raises(UserInputError) as exc:
        load_scenario(_scenario(tmp_path, text))
    message = str(exc.value)
    assert says in message and "\n" not in message and len(message) < 1500, message
    return message


ENGINE = "engine: {kind: sim-virtual, model: llama-2-7b}\n"


@pytest.mark.parametrize(("text", "says"), [
    # tracebacks before
    ("engine: {kind: sim-virtual, model: '" + "x" * 5000 + "'}\n", "engine.model: String should have at most 4096"),
    ("engine: {kind: sim-virtual, model: 'a/" + "b" * 300 + "'}\n", "engine.model: "),
    (ENGINE + "workload: {requests: {prompt_tokens: {kind: lognormal, median: 100, sigma: 1e300}}}\n",
     "workload.requests.prompt_tokens.sigma: Input should be less than or equal to 10"),
    (ENGINE + "workload: {requests: {prompt_tokens: {kind: lognormal, median: .inf, sigma: 1}}}\n",
     "prompt_tokens.median: Input should be a finite number"),
    ("engine: {kind: sim, model: llama-2-7b, env: {'A=B': x}}\n", "engine.env: variable name 'A=B' is not a POSIX"),
    # accepted before
    (ENGINE + "workload: {requests: {count: true}}\n", "workload.requests.count: Input should be a valid integer"),
    (ENGINE + "workload: {requests: {count: 1e29}}\n", "workload.requests.count: Input should be a valid integer"),
    (ENGINE + "workload: {requests: {count: 100000000000000000000000000000}}\n", "count: Input should be less"),
    (ENGINE + "workload: {arrivals: {time_scale: .inf}}\n", "workload.arrivals.time_scale: Input should be a finite"),
    (ENGINE + "search_space: {gpu-memory-utilization: {type: float, low: .nan, high: 0.9}}\n", "low: Input should be"
     " a finite number"),
    (ENGINE + "search_space: {gpu-memory-utilization: {type: float, low: 0.5, high: .inf}}\n", "finite number"),
    (ENGINE + "name: a\nname: b\n", ":3: not valid YAML: duplicate key 'name' (lines 2 and 3): keep one"),
    (ENGINE + "engine: {kind: sim, model: x}\n", "duplicate key 'engine' (lines 1 and 2)"),
    (ENGINE + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9 if p else ['x'] * 9)}]\n"
                      for p, c in zip(["", "a", "b", "c", "d", "e"], "abcdef", strict=True)),
     "more than 100000 values once its aliases"),
    # names that become a path component
    ("name: '..'\n" + ENGINE, "name: '..' cannot name files"),
    ("name: .hidden\n" + ENGINE, "name: '.hidden' cannot name files"),
    ("name: a/b\n" + ENGINE, "name: 'a/b' cannot name files"),
    ("name: \"a\\0b\"\n" + ENGINE, "cannot name files"),
    ("name: " + "n" * 101 + "\n" + ENGINE, "cannot name files"),
    # engine.env names
    ("engine: {kind: sim-virtual, model: llama-2-7b, env: {'A;touch x': y}}\n", "not a POSIX name"),
    ("engine: {kind: sim-virtual, model: llama-2-7b, env: {\"A\\nExecStartPre=/bin/sh\": y}}\n", "not a POSIX"),
    ("engine: {kind: sim-virtual, model: llama-2-7b, env: {'1A': y}}\n", "not a POSIX name"),
    # checked at load, no longer after the database is opened
    (ENGINE + "budget: {timeout: forever}\n", "budget.timeout: duration 'forever'"),
    (ENGINE + "workload: {requests: {kind: trace, path: t.jsonl}}\n", "engine.kind: sim-virtual takes synthetic"),
])
def test_refused_at_load(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "t.jsonl").write_text('{"prompt": "a", "max_tokens": 3}\n')
    _refused(tmp_path, text, says)


def test_valid_values_still_load(tmp_path: Path) -> None:
    """The numbers YAML 1.2 reads as numbers (`1e-3`) are numbers; a plain POSIX env name and a dotted name load."""
    sc = load_scenario(_scenario(tmp_path, "name: my.scenario-1\nengine: {kind: sim-virtual, model: llama-2-7b, "
                                            "env: {_A1: x}}\nworkload: {arrivals: {kind: poisson, rate: 5e-1}}\n"))
    assert sc.name == "my.scenario-1" and sc.workload.arrivals.rate == 0.5 and sc.engine.env == {"_A1": "x"}


def test_a_50_mb_scenario_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("w") as f:
        f.write(ENGINE)
        f.write(("#" * 1023 + "\n") * 50 * 1024)
    with pytest.raises(UserInputError, match="larger than 1024 KiB"):
        load_scenario(path)


def test_a_quoted_value_is_cut() -> None:
    text = quoted("x" * 10_000)
    assert len(text) < 300 and text.endswith("…(10002 chars)")


@pytest.mark.parametrize("item", ["gpu-memory-utilization=nan", "cpu-offload-gb=nan", "cpu-offload-gb=inf",
                                  "some-new-flag=nan", "some-new-flag=-inf", "some-new-flag=" + "9" * 400])
def test_set_refuses_non_finite_numbers(item: str) -> None:
    with pytest.raises(UserInputError, match=r"^--set "):
        parse_set([item])


def test_set_keeps_finite_numbers() -> None:
    assert parse_set(["gpu-memory-utilization=0.9", "some-new-flag=1e3"]) == {"gpu-memory-utilization": 0.9,
                                                                              "some-new-flag": 1000.0}


def test_a_trace_line_with_line_separators_in_a_string_is_one_request(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt": "a\u2028b\u0085c\u2029d\x1ce", "max_tokens": 3}, ensure_ascii=False) + "\n"
                    + json.dumps({"prompt": "x", "max_tokens": 2}) + "\r\n")
    requests = load_trace(path)
    assert [r.prompt for r in requests] == ["a\u2028b\u0085c\u2029d\x1ce", "x"]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "9" * 400, "1" * 30 + "d"])
def test_durations_are_finite_and_bounded(value: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        duration_s(value)
    if isinstance(value, str):
        with pytest.raises(UserInputError, match="duration"):
            parse_duration(value)


def _daemon_config(tmp_path: Path, **changes: Any) -> Path:
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(BASE))
    config: dict[str, Any] = {"scenario": "scenario.yaml", "production": {"endpoint": "http://127.0.0.1:9"},
                              "deploy": {"kind": "file", "config_path": "tuned.yaml"}}
    for path, value in changes.items():
        node = config
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "daemon.yaml"


@pytest.mark.parametrize(("changes", "says"), [
    ({"production__endpoint": "http://a b"}, "production.endpoint: String should match pattern"),
    ({"triggers__poll_interval_s": float("inf")}, "triggers.poll_interval_s: duration inf: at most 366 days"),
    ({"triggers__poll_interval_s": "9" * 400}, "triggers.poll_interval_s: duration '999"),
    ({"triggers__poll_interval_s": "9" * 40}, "at most 366 days"),
    ({"min_interval_s": float("nan")}, "min_interval_s: duration nan must be ≥ 0"),
    ({"listen__host": "203.0.113.7"}, "listen.host: cannot listen on '203.0.113.7'"),
])
def test_daemon_config_refusals(tmp_path: Path, changes: dict[str, Any], says: str) -> None:
    with pytest.raises(DaemonConfigError) as exc:
        load_config(_daemon_config(tmp_path, **changes))
    assert says in str(exc.value), str(exc.value)


@pytest.mark.parametrize(("argv", "text", "says"), [
    (["tune"], ENGINE + "budget: {timeout: forever}\n", "budget.timeout"),
    (["tune"], ENGINE + "workload: {requests: {kind: trace, path: t.jsonl}}\n", "engine.kind: sim-virtual"),
    (["measure"], "name: '..'\n" + ENGINE, "name: '..' cannot name files"),
    (["measure"], "engine: {kind: sim, model: llama-2-7b, env: {'A=B': x}}\n", "not a POSIX name"),
])
def test_through_the_cli_nothing_is_written(tmp_path: Path, argv: list[str], text: str, says: str) -> None:
    """As the user runs it: one `error:` line, exit 2, no database, no log directory, no file."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.yaml").write_text(text)
    (work / "t.jsonl").write_text('{"prompt": "a", "max_tokens": 3}\n')
    before = set(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "autotuner", *argv, "s.yaml"], cwd=work, capture_output=True,
                          text=True, timeout=120, env={"AUTOTUNER_HOME": str(tmp_path / "home"),
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert set(tmp_path.rglob("*")) == before


def test_daemon_plan_refuses_an_unbindable_host_and_writes_nothing(tmp_path: Path) -> None:
    config = _daemon_config(tmp_path, listen__host="203.0.113.7")
    before = set(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "run", "--once", str(config)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"AUTOTUNER_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "listen.host" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert set(tmp_path.rglob("*")) == before
