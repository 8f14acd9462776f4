"""The vLLM version probe: one run per command and environment in a process, shared by the preflight
and the study key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from autotuner.backends import VLLM
from autotuner.preflight.engine_checks import check_engine
from autotuner.scenario import load_scenario
from autotuner.vllm.versions import VERSION_SCRIPT, probe_version, version_argv


def fake_engine(tmp_path: Path, answer: str = "0.32.0") -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    engine = tmp_path / "fake-vllm"
    engine.write_text(f"#!{sys.executable}\nwith open({str(runs)!r}, 'a') as f:\n    f.write('x')\nprint({answer!r})\n")
    engine.chmod(0o755)
    return engine, runs


def test_the_interpreter_is_asked_for_the_distribution() -> None:
    assert version_argv(["/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]) == [
        "/venv/bin/python3", "-c", VERSION_SCRIPT]
    assert version_argv(["vllm", "serve"]) == ["vllm", "--version"]


def test_one_run_per_command_and_environment(tmp_path: Path) -> None:
    engine, runs = fake_engine(tmp_path)
    env = dict(os.environ)
    first = probe_version([str(engine), "serve"], env)
    assert first.answer == "0.32.0" and probe_version([str(engine), "serve"], env) == first
    assert runs.read_text() == "x"
    probe_version([str(engine), "serve"], {**env, "OTHER": "1"})
    assert runs.read_text() == "xx"


def test_the_preflight_and_the_study_key_share_the_probe(tmp_path: Path) -> None:
    engine, runs = fake_engine(tmp_path, "vllm 0.32.1")
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({"engine": {"command": [str(engine), "serve"], "model": "m"},
                                    "monitor": {"kind": "host"}}))
    scenario = load_scenario(path)
    checks, version = check_engine(scenario)
    assert version == "0.32.1" and [c.status for c in checks] == ["ok", "ok"]
    assert VLLM.engine_version(scenario) == "vllm 0.32.1"
    assert runs.read_text() == "x"


def test_a_command_that_cannot_start_is_unknown(tmp_path: Path) -> None:
    probe = probe_version([str(tmp_path / "missing")], dict(os.environ))
    assert probe.answer is None and probe.start_error
