"""A value the scenario took from the tuner's environment (`${VAR}`) is stored by name and exported by
name: the deployment supplies it, the file never holds what the tuner's environment held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotuner.export.exporter import run_export
from autotuner.store.db import Store
from tests.support.studies import MakeStudy


def test_env_references_are_exported_by_name(make_study: MakeStudy, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELS_ROOT", "/srv/private-models-xyz")
    study = make_study(engine={"env": {"HF_HOME": "${MODELS_ROOT}/hf", "VLLM_LOGGING_LEVEL": "INFO"}})
    stored = Store(study.storage, create=False).study(study.name)
    assert stored is not None and stored.scenario["engine"]["env"]["HF_HOME"] == "${MODELS_ROOT}/hf"
    out = tmp_path / "winner.json"
    assert run_export(study.storage, None, [], "knee", "json", out, force=True, allow_unverified=True) == 0
    payload = json.loads(out.read_text())
    assert payload["env"] == {"VLLM_LOGGING_LEVEL": "INFO"}
    assert payload["secret_env"] == ["HF_HOME"]
    assert "/srv/private-models-xyz" not in out.read_text()
    cmd = tmp_path / "serve.sh"
    assert run_export(study.storage, None, [], "knee", "cmd", cmd, force=True, allow_unverified=True) == 0
    assert "supply them from the environment: HF_HOME" in cmd.read_text()
