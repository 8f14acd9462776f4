from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from autotuner.analysis.selection import select
from autotuner.errors import UserInputError
from autotuner.export.exporter import run_export
from autotuner.sim.args import build_config, parse_args
from autotuner.store.db import TrialRecord
from tests.support.studies import RTX_3090, SECRET, FakeGpus, MakeStudy, StudyDb

POLICY = "max-throughput"


def export(study: StudyDb, fmt: str, out: Path, slo: list[str] | None = None) -> str:
    assert run_export(study.storage, None, slo or [], POLICY, fmt, out, force=False, allow_unverified=True) == 0
    return out.read_text()


@pytest.fixture(scope="module")
def winner(study_db: StudyDb) -> TrialRecord:
    return select(study_db.storage, None, [], POLICY).chosen


def sim_parse(argv: list[str]) -> dict[str, object]:
    """vLLM's own reading of an argv (the simulator parses `vllm serve` the way vLLM 0.32 does)."""
    ns = parse_args(argv)
    build_config(ns, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})  # a valid engine config, not just valid syntax
    return vars(ns)


def assert_same_flags(parsed: dict[str, object], flags: dict[str, object]) -> None:
    for name, value in flags.items():
        assert parsed[name.replace("-", "_")] == pytest.approx(value), name


def assert_clean(text: str) -> None:
    assert SECRET not in text
    for owned in ("--host", "--port", "--api-key"):
        assert owned not in text.replace("--api-key on a command line", "")


def test_cmd(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "cmd", tmp_path / "serve.sh")
    assert_clean(text)
    tokens = shlex.split(text, comments=True)
    env = [t for t in tokens[:3] if "=" in t and not t.startswith("-")]
    argv = tokens[len(env):]
    assert env == ["VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"]
    assert argv[:3] == ["vllm", "serve", "llama-2-13b"]
    assert_same_flags(sim_parse(argv[2:]), winner.flags)
    assert f"trial {winner.trial_number}" in text and study_db.name in text


def test_yaml_is_a_vllm_config_file(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    path = tmp_path / "vllm.yaml"
    text = export(study_db, "yaml", path)
    assert_clean(text)
    data = yaml.safe_load(text)
    assert data.pop("served-model-name") == "llama-2-13b"
    assert "model" not in data
    assert data == winner.flags
    assert_same_flags(sim_parse(["llama-2-13b", "--config", str(path)]), winner.flags)


def test_yaml_booleans(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path) -> None:
    fake_nvml(*RTX_3090, 2)
    study = make_study()
    path = tmp_path / "vllm.yaml"
    text = export(study, "yaml", path)
    assert "enable-prefix-caching: false" in text  # trial 1 of the known front
    parsed = sim_parse(["llama-2-13b", "--config", str(path), "--sim-gpus", "2"])
    assert parsed["enable_prefix_caching"] is False


def test_compose(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "compose", tmp_path / "compose.yaml")
    assert SECRET not in text
    service = yaml.safe_load(text)["services"]["vllm"]
    assert service["image"] == "vllm/vllm-openai:v0.32.0"
    command = service["command"]
    assert all(isinstance(c, str) for c in command)
    assert command[0] == "llama-2-13b"
    assert_same_flags(sim_parse(command), winner.flags)
    assert "--host" not in command and "--port" not in command
    env = service["environment"]
    assert env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert env["VLLM_API_KEY"].startswith("${VLLM_API_KEY:?")  # the study served with a key
    assert env["HF_TOKEN"] == "${HF_TOKEN}"
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device == {"driver": "nvidia", "capabilities": ["gpu"], "count": 8}


def test_systemd(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "systemd", tmp_path / "vllm.service")
    assert_clean(text)
    lines = text.splitlines()
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart=/usr/bin/env "))
    assert argv[:3] == ["vllm", "serve", "llama-2-13b"]
    assert_same_flags(sim_parse(argv[2:]), winner.flags)
    assert "Restart=on-failure" in lines
    assert 'Environment="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"' in lines
    assert lines.index("[Unit]") < lines.index("[Service]") < lines.index("[Install]")


def test_env(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "env", tmp_path / "vllm.env")
    assert SECRET not in text
    values = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert values["VLLM_MODEL"] == "llama-2-13b"
    args = shlex.split(shlex.split(values["VLLM_ARGS"])[0])
    assert_same_flags(sim_parse(["llama-2-13b", *args]), winner.flags)
    for name, value in winner.flags.items():
        assert values["AUTOTUNER_FLAG_" + name.upper().replace("-", "_")] == str(value)
    assert values["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert "HF_TOKEN" not in values


def test_json_certificate(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    data = json.loads(export(study_db, "json", tmp_path / "winner.json"))
    assert SECRET not in json.dumps(data)
    assert data["flags"] == winner.flags
    assert data["api_key_env"] == "VLLM_API_KEY" and data["secret_env"] == ["HF_TOKEN"]
    cert = data["certificate"]
    for key in ("study", "trial", "metrics", "memory", "peak_fraction", "oom_threshold", "engine_version",
                "gpu_inventory", "model_fingerprint", "workload_fingerprint", "baseline", "simulator", "slos"):
        assert key in cert, key
    assert (cert["study"], cert["trial"]) == (study_db.name, winner.trial_number)
    assert cert["metrics"]["output_tokens_per_s"] == pytest.approx(winner.metrics["output_tokens_per_s"])
    assert len(cert["memory"]) == 8 and len(cert["gpu_inventory"]) == 8
    gpu = cert["memory"][0]
    assert gpu["headroom_gib"] == pytest.approx(gpu["total_gib"] - gpu["peak_gib"], abs=0.01)
    assert gpu["threshold_gib"] == pytest.approx(gpu["total_gib"] * 0.97, abs=0.01)
    assert cert["baseline"]["trial"] == 0 and cert["baseline"]["outcome"] == "ok"  # defaults serve (sim/memory.py)
    assert "virtual time" in cert["simulator"]
    assert "published runs" in cert["simulator"]  # the simulator's measured error travels with it


def test_certificate_comment_block(study_db: StudyDb, tmp_path: Path) -> None:
    text = export(study_db, "yaml", tmp_path / "c.yaml")
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for fact in ("TTFT p50", "TPOT p50", "e2e p95", "completed", "headroom", "OOM threshold: 97%",
                 "engine: vLLM 0.32.0", "8× NVIDIA GeForce RTX 3090", "fingerprint",
                 "vLLM's defaults (trial 0)", "measured (simulated", "simulator:"):
        assert fact in comments, fact


def test_stdout(study_db: StudyDb, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_export(study_db.storage, None, [], "knee", "cmd", Path("-"), force=False, allow_unverified=True) == 0
    out, err = capsys.readouterr()
    assert "vllm serve llama-2-13b" in out and "wrote" not in err
    assert run_export(study_db.storage, None, [], "knee", "json", None, force=False, allow_unverified=True) == 0
    assert json.loads(capsys.readouterr().out)["certificate"]["policy"] == "knee"


def test_refusal_writes_nothing(study_db: StudyDb, tmp_path: Path) -> None:
    out = tmp_path / "vllm.yaml"
    with pytest.raises(UserInputError, match="meets every SLO"):
        run_export(study_db.storage, None, ["ttft_p95<=1ms"], POLICY, "yaml", out, force=False, allow_unverified=True)
    assert list(tmp_path.iterdir()) == []


def test_replaces_atomically(study_db: StudyDb, tmp_path: Path) -> None:
    out = tmp_path / "vllm.yaml"
    out.write_text("old\n")
    assert run_export(study_db.storage, None, [], POLICY, "yaml", out, force=True, allow_unverified=True) == 0
    assert out.read_text().startswith("# autotuner certificate")
    assert [p.name for p in tmp_path.iterdir()] == ["vllm.yaml"]  # no temp file left behind


@pytest.mark.parametrize(("fmt", "output", "says"), [
    ("helm", None, "--format 'helm'"),
    ("yaml", "missing-dir/x.yaml", "does not exist"),
    ("yaml", ".", "is a directory"),
])
def test_bad_arguments(study_db: StudyDb, tmp_path: Path, fmt: str, output: str | None, says: str) -> None:
    with pytest.raises(UserInputError, match=says):
        run_export(study_db.storage, None, [], POLICY, fmt, None if output is None else tmp_path / output, False, True)


def test_export_of_an_empty_storage(tmp_path: Path) -> None:
    from autotuner.store.db import Store

    Store(str(tmp_path / "empty.db"))
    with pytest.raises(UserInputError, match="holds no study"):
        run_export(str(tmp_path / "empty.db"), None, [], POLICY, "yaml", tmp_path / "x.yaml", False, True)
    assert not (tmp_path / "x.yaml").exists()


def test_export_of_an_unknown_study(study_db: StudyDb) -> None:
    with pytest.raises(UserInputError, match="study 'other' is not in"):
        run_export(study_db.storage, "other", [], POLICY, "cmd", None, False, True)
