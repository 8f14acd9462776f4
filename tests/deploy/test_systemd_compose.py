"""`kind: systemd` and `kind: compose` against fake `systemctl` / `docker` executables (real programs that
record their argv and keep the unit's state in a file): the commands run, in order, and a unit that
fails to start is an error naming the unit and what systemd said."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.deploy import DeployError, make_target, parse_deploy_spec
from tests.support.fake_services import REFUSED_KEY, FakeService

GOOD = {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.88}
BAD = {"max-num-batched-tokens": 8192, REFUSED_KEY: 1}


def systemd(tmp_path: Path, **extra: object):
    config = tmp_path / "etc" / "tuned.yaml"
    config.parent.mkdir()
    fake = FakeService(tmp_path, config)
    spec = parse_deploy_spec({"kind": "systemd", "config_path": str(config), "unit": "vllm.service",
                              "systemctl": [str(fake.systemctl("vllm.service"))], "unit_dir": str(tmp_path),
                              **extra})
    return make_target(spec), fake


def test_systemd_deploy_failure_and_rollback(tmp_path: Path) -> None:
    target, fake = systemd(tmp_path)
    assert target.is_up() is False
    target.write(GOOD)
    target.apply()
    assert fake.calls() == [["is-active", "--quiet", "vllm.service"], ["daemon-reload"], ["restart", "vllm.service"]]
    assert target.is_up() is True and fake.serving() == GOOD

    target.write(BAD)
    with pytest.raises(DeployError) as failed:
        target.apply()
    assert str(failed.value).startswith("systemd unit vllm.service: `")
    assert "restart vllm.service` exited with code 1; last stderr: vllm: error: unrecognized arguments: " \
           f"--{REFUSED_KEY} | Job for vllm.service failed" in str(failed.value)
    assert "journalctl -u vllm.service" in str(failed.value)
    assert target.is_up() is False

    assert target.restore_previous()
    target.apply()
    assert target.is_up() is True and fake.serving() == GOOD
    target.stop()
    assert target.is_up() is False
    target.start()
    assert fake.calls()[-3:] == [["stop", "vllm.service"], ["is-active", "--quiet", "vllm.service"],
                                 ["start", "vllm.service"]]


def test_systemd_drop_in_points_the_unit_at_the_config(tmp_path: Path) -> None:
    target, fake = systemd(tmp_path, drop_in={"exec_start": ["/opt/vllm/bin/vllm", "serve", "/models/Llama 3",
                                                             "--port", "8000"]})
    target.write(GOOD)
    target.apply()
    drop_in = tmp_path / "vllm.service.d" / "autotuner.conf"
    assert drop_in.read_text().splitlines()[1:] == [
        "[Service]", "ExecStart=",
        f"ExecStart=/opt/vllm/bin/vllm serve \"/models/Llama 3\" --port 8000 --config {target.config_path}"]
    assert fake.calls() == [["daemon-reload"], ["restart", "vllm.service"]]


def test_systemctl_missing_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "tuned.yaml"
    spec = parse_deploy_spec({"kind": "systemd", "config_path": str(config), "unit": "vllm.service",
                              "systemctl": [str(tmp_path / "no-systemctl")]})
    with pytest.raises(DeployError, match="no-systemctl' not found; install it or give its absolute path"):
        make_target(spec).apply()


def test_compose_up_stop_ps_and_rollback(tmp_path: Path) -> None:
    config = tmp_path / "tuned.yaml"
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text("services: {vllm: {image: vllm/vllm-openai}}\n")
    fake = FakeService(tmp_path, config)
    spec = parse_deploy_spec({"kind": "compose", "config_path": str(config), "compose_file": str(compose_file),
                              "service": "vllm", "project_name": "prod", "docker": [str(fake.docker("vllm"))]})
    target = make_target(spec)
    head = ["compose", "-f", str(compose_file), "-p", "prod"]
    assert target.is_up() is False
    target.write(GOOD)
    target.apply()
    assert target.is_up() is True and fake.serving() == GOOD
    target.write(BAD)
    with pytest.raises(DeployError, match=r"compose service vllm: `.*up -d --force-recreate --no-deps vllm` exited "
                                          r"with code 1; last stderr: vllm: error: unrecognized arguments"):
        target.apply()
    target.restore_previous()
    target.apply()
    assert fake.serving() == GOOD
    target.stop()
    assert target.is_up() is False
    assert fake.calls() == [
        [*head, "ps", "--status", "running", "--quiet", "vllm"],
        [*head, "up", "-d", "--force-recreate", "--no-deps", "vllm"],
        [*head, "ps", "--status", "running", "--quiet", "vllm"],
        [*head, "up", "-d", "--force-recreate", "--no-deps", "vllm"],
        [*head, "up", "-d", "--force-recreate", "--no-deps", "vllm"],
        [*head, "stop", "vllm"],
        [*head, "ps", "--status", "running", "--quiet", "vllm"],
    ]
