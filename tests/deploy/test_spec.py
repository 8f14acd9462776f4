"""Bad `deploy:` sections: one clear error naming the field and how to fix it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotuner.deploy import DeploySpecError, SystemdSpec, parse_deploy_spec
from autotuner.errors import UserInputError


def bad(data: object, base_dir: Path | None = None) -> str:
    with pytest.raises(DeploySpecError) as err:
        parse_deploy_spec(data, base_dir)
    assert isinstance(err.value, UserInputError) and err.value.exit_code == 2
    return str(err.value)


def test_a_shell_string_is_refused(tmp_path: Path) -> None:
    message = bad({"kind": "command", "config_path": str(tmp_path / "c.yaml"),
                   "start": "vllm serve m --config c.yaml"})
    assert message.startswith("deploy.start: 'vllm serve m --config c.yaml' is a string; give an argv list")
    assert "without a shell" in message


def test_kind_missing_unknown_or_a_setting_of_another_kind(tmp_path: Path) -> None:
    assert bad({"config_path": "x.yaml"}) == "deploy.kind: missing; use one of file, command, systemd, compose"
    assert "unknown kind 'k8s'; use one of file, command, systemd, compose" in bad({"kind": "k8s"})
    message = bad({"kind": "file", "config_path": str(tmp_path / "c.yaml"), "unit": "vllm.service"})
    assert message == "deploy.unit: not a setting of this kind; remove it (a typo?)"
    assert bad({"kind": "command", "config_path": str(tmp_path / "c.yaml")}) == "deploy.start: Field required"


def test_config_path_directory_must_exist_and_be_a_yaml_file(tmp_path: Path) -> None:
    missing = tmp_path / "etc" / "vllm"
    message = bad({"kind": "file", "config_path": str(missing / "tuned.yaml")})
    assert f"directory {missing} does not exist; create it (mkdir -p {missing})" in message
    assert "is a directory" in bad({"kind": "file", "config_path": str(tmp_path)})
    assert "use a .yaml file name" in bad({"kind": "file", "config_path": str(tmp_path / "tuned.conf")})


def test_relative_paths_are_taken_against_the_config_files_directory(tmp_path: Path) -> None:
    spec = parse_deploy_spec({"kind": "file", "config_path": "tuned.yaml"}, base_dir=tmp_path)
    assert spec.config_path == tmp_path / "tuned.yaml"


def test_systemd_unit_and_drop_in(tmp_path: Path) -> None:
    spec = parse_deploy_spec({"kind": "systemd", "config_path": str(tmp_path / "c.yaml"), "unit": "vllm",
                              "unit_dir": str(tmp_path)})
    assert isinstance(spec, SystemdSpec) and spec.unit == "vllm.service"
    assert "expected a service unit name" in bad({"kind": "systemd", "config_path": str(tmp_path / "c.yaml"),
                                                  "unit": "vllm; rm -rf /"})
    message = bad({"kind": "systemd", "config_path": str(tmp_path / "c.yaml"), "unit": "vllm.service",
                   "unit_dir": str(tmp_path), "drop_in": {"exec_start": ["vllm", "serve", "m"]}})
    assert "systemd needs an absolute program path; 'vllm' is not" in message
    message = bad({"kind": "systemd", "config_path": str(tmp_path / "c.yaml"), "unit": "vllm.service",
                   "unit_dir": str(tmp_path / "nowhere"), "drop_in": {"exec_start": ["/usr/bin/vllm", "serve"]}})
    assert message.startswith("deploy.drop_in: directory") and "does not exist" in message


def test_compose_file_must_exist(tmp_path: Path) -> None:
    message = bad({"kind": "compose", "config_path": str(tmp_path / "c.yaml"),
                   "compose_file": str(tmp_path / "compose.yaml"), "service": "vllm"})
    assert message == f"deploy.compose_file: {tmp_path / 'compose.yaml'} does not exist " \
                      "(give the compose file that defines the service)"


def test_argv_items_must_be_strings(tmp_path: Path) -> None:
    message = bad({"kind": "command", "config_path": str(tmp_path / "c.yaml"), "start": [sys.executable, ["x"]]})
    assert "argv items must be strings; ['x'] is not" in message
    assert "an empty command" in bad({"kind": "command", "config_path": str(tmp_path / "c.yaml"), "start": []})
