from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotuner.errors import UserInputError
from autotuner.export.exporter import run_export
from autotuner.monitor import factory
from autotuner.monitor.base import NvmlUnavailableError
from autotuner.scenario import Scenario
from autotuner.tuner.runners import model_fingerprint
from tests.support.studies import RTX_3090, FakeGpus, MakeStudy, StudyDb, key_for

A100 = ("NVIDIA A100-SXM4-80GB", 85899345920)


def certificate(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())["certificate"]  # type: ignore[no-any-return]


def test_same_gpus(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path) -> None:
    fake_nvml(*RTX_3090, 2)
    study = make_study()
    assert run_export(study.storage, None, [], "knee", "json", tmp_path / "w.json", False, True) == 0
    notes = certificate(tmp_path / "w.json")["target"]
    assert "GPUs: 2× NVIDIA GeForce RTX 3090 (23.69 GiB), as in the study key" in notes  # type: ignore[operator]


def test_other_gpus_refuse_unless_forced(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml(*A100, 2)
    study = make_study()
    out = tmp_path / "w.json"
    with pytest.raises(UserInputError) as err:
        run_export(study.storage, None, [], "knee", "json", out, force=False, allow_unverified=True)
    message = str(err.value)
    assert "2× NVIDIA A100-SXM4-80GB (80.00 GiB)" in message and "2× NVIDIA GeForce RTX 3090 (23.69 GiB)" in message
    assert "--force" in message
    assert not out.exists()
    assert run_export(study.storage, None, [], "knee", "json", out, force=True, allow_unverified=True) == 0
    assert any("exported with --force" in note for note in certificate(out)["target"])  # type: ignore[union-attr]
    assert "warning: --force" in capsys.readouterr().err


def test_pinned_gpus_are_compared(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path) -> None:
    fake_nvml(*RTX_3090, 4)
    study = make_study(engine={"gpus": [1, 3]})  # the key holds the two GPUs the study ran on
    assert run_export(study.storage, None, [], "knee", "compose", tmp_path / "c.yaml", False, True) == 0
    assert "device_ids:\n            - '1'\n            - '3'" in (tmp_path / "c.yaml").read_text()


def test_no_nvml_warns_and_exports(make_study: MakeStudy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    def unavailable(*_args: object, **_kw: object) -> None:
        raise NvmlUnavailableError("NVML not available: it sees no GPU")

    monkeypatch.setattr(factory, "open_monitor", unavailable)
    study = make_study()
    assert run_export(study.storage, None, [], "knee", "yaml", tmp_path / "v.yaml", False, True) == 0
    assert "warning: GPU check skipped, NVML is unavailable here" in capsys.readouterr().err


def test_simulated_study_needs_no_gpu(study_db: StudyDb, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def must_not_be_called(*_args: object, **_kw: object) -> None:
        raise AssertionError("a simulated study is compared with its own simulated inventory")

    monkeypatch.setattr(factory, "open_monitor", must_not_be_called)
    assert run_export(study_db.storage, None, [], "knee", "json", tmp_path / "w.json", False, True) == 0
    assert any("simulated" in note for note in certificate(tmp_path / "w.json")["target"])  # type: ignore[union-attr]


def test_changed_model_refuses(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path) -> None:
    fake_nvml(*RTX_3090, 2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 5120, "num_hidden_layers": 40}))
    base = make_study(engine={"model": str(model)}, db="probe.db").scenario
    fingerprint = model_fingerprint(Scenario.model_validate(base.model_dump(mode="json")))
    study = make_study(engine={"model": str(model)}, key=key_for(base, fingerprint=fingerprint))
    out = tmp_path / "v.yaml"
    assert run_export(study.storage, None, [], "knee", "yaml", out, False, True) == 0
    assert f"fingerprint {fingerprint} recomputed" in out.read_text()

    (model / "config.json").write_text(json.dumps({"hidden_size": 5120, "num_hidden_layers": 80}))
    out.unlink()
    with pytest.raises(UserInputError, match=r"the model in .* changed since the study .* Re-tune"):
        run_export(study.storage, None, [], "knee", "yaml", out, force=False, allow_unverified=True)
    assert not out.exists()
    assert run_export(study.storage, None, [], "knee", "yaml", out, force=True, allow_unverified=True) == 0
    assert "exported with --force although the model" in out.read_text()


def test_absent_model_directory_warns(make_study: MakeStudy, fake_nvml: FakeGpus, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml(*RTX_3090, 2)
    study = make_study(engine={"model": str(tmp_path / "gone")})
    assert run_export(study.storage, None, [], "knee", "cmd", None, False, True) == 0
    assert "is not here: its fingerprint was not checked" in capsys.readouterr().err
