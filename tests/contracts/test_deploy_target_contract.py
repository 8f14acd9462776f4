"""The deploy-target contract: what the daemon's deploy / verify / roll back cycle may rely on from any
`DeployTarget` (autotuner/deploy/base.py), whichever `deploy.kind` the user configured.

Run over every implementation, built as the daemon builds them (`parse_deploy_spec` + `make_target`):
`file`; `command` whose start is a real child process (a tiny HTTP service that reads the live file, refuses
an option it does not know, as vLLM does, and forks a worker into its process group); `systemd` and
`compose` against the fake `systemctl` / `docker` executables of tests/support/fake_services.py (real programs that
keep the unit's state and the flags it runs in a file).

Every target:
- is a `DeployTarget` of its kind, on the spec's config path;
- has nothing live before the first write: `current()` is None, `restore_previous()` False; a live file
  that is not a mapping of options is a DeployError saying so;
- round-trips the flags: `write()` then `current()` gives them back, and the file is byte for byte
  `render_config(flags)` (what `autotuner export --format yaml` writes);
- keeps the replaced file as `<config>.previous` (mode kept, no temp file left, a rewrite of the live flags
  does not clobber it), and `restore_previous()` puts it back, as often as asked;
- never touches the files in `apply` / `stop` / `start`;
- answers `is_up()` with None exactly when it runs no service (file), else with a bool, at every step.

Every service target (command, systemd, compose) besides:
- `apply()` makes the service run the live file, and a later `apply()` the newer one;
- `stop()` takes it down, and is safe to repeat; `start()` brings it back on the live file;
- a config the service refuses is a DeployError in the service's words, the service is down, and
  `restore_previous()` + `apply()` brings the old flags back;
- leaves nothing behind once stopped: no process of the service (its whole group), no engine registry entry.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from autotuner.deploy import DeployError, DeployTarget, make_target, parse_deploy_spec, render_config
from autotuner.deploy.base import PREVIOUS_SUFFIX
from autotuner.engine.ports import free_port
from autotuner.engine.registry import EngineRegistry
from autotuner.vllm import FlagValue
from tests.support.fake_services import REFUSED_KEY, FakeService

A: dict[str, FlagValue] = {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.85,
                           "enable-chunked-prefill": True, "served-model-name": "prod"}
B: dict[str, FlagValue] = {"max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.9, "cpu-offload-gb": 4}
REFUSED: dict[str, FlagValue] = {**B, REFUSED_KEY: 1}
SERVICE_KINDS = ["command", "systemd", "compose"]
KINDS = ["file", *SERVICE_KINDS]

# The `command` target's production: reads the live file once at start (as `vllm serve --config` does),
# refuses an option it does not know, forks a worker into its own process group, writes both PIDs down and
# serves /health and the flags it runs with (/flags) until signalled.
SERVICE = f"""
import json, subprocess, sys, time, yaml
from http.server import BaseHTTPRequestHandler, HTTPServer
config_path, port, pids = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flags = yaml.safe_load(open(config_path)) or {{}}
if {REFUSED_KEY!r} in flags:
    sys.stderr.write("vllm: error: unrecognized arguments: --{REFUSED_KEY}\\n")
    sys.exit(2)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(pids, "a") as f:
    f.write(f"{{__import__('os').getpid()}} {{worker.pid}}\\n")

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(flags).encode() if self.path == "/flags" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@dataclass
class Deployed:
    """One target set up for a test, with what only the test can observe of its service: the flags it
    runs with (None while down), how to wait until an `apply` / `start` serves (a DeployError if it went
    down instead) and which processes of the service are still alive."""

    kind: str
    target: DeployTarget
    serving: Callable[[], dict[str, object] | None] | None  # None: the target runs no service
    settle: Callable[[], None]
    alive: Callable[[], list[int]]

    @property
    def config(self) -> Path:
        return self.target.config_path

    @property
    def previous(self) -> Path:
        return self.config.with_name(self.config.name + PREVIOUS_SUFFIX)


def _alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            continue
    return found


def _build(kind: str, tmp_path: Path) -> tuple[Deployed, Callable[[], None]]:
    """The target of `kind` and a safety net that ends whatever of its service a failed test left."""
    etc = tmp_path / "etc"  # the live file's directory holds nothing else: temp files would show
    etc.mkdir()
    config = etc / "tuned.yaml"
    fake = FakeService((tmp_path / "fake").resolve(), config)
    (tmp_path / "fake").mkdir()

    def no_processes() -> list[int]:
        return []

    def nothing_to_wait_for() -> None:
        """`apply` / `start` return once the (fake) service manager has started the unit."""

    if kind == "file":
        target = make_target(parse_deploy_spec({"kind": "file", "config_path": str(config)}))
        return Deployed(kind, target, None, nothing_to_wait_for, no_processes), lambda: None
    if kind == "systemd":
        (tmp_path / "units").mkdir()
        target = make_target(parse_deploy_spec({
            "kind": "systemd", "config_path": str(config), "unit": "vllm.service",
            "systemctl": [str(fake.systemctl("vllm.service"))], "unit_dir": str(tmp_path / "units")}))
        return Deployed(kind, target, fake.serving, nothing_to_wait_for, no_processes), lambda: None
    if kind == "compose":
        compose_file = tmp_path / "compose.yaml"
        compose_file.write_text("services: {vllm: {image: vllm/vllm-openai}}\n")
        target = make_target(parse_deploy_spec({
            "kind": "compose", "config_path": str(config), "compose_file": str(compose_file), "service": "vllm",
            "docker": [str(fake.docker("vllm"))]}))
        return Deployed(kind, target, fake.serving, nothing_to_wait_for, no_processes), lambda: None

    port = free_port()
    pidfile = tmp_path / "service.pids"
    target = make_target(parse_deploy_spec({
        "kind": "command", "config_path": str(config),
        "start": [sys.executable, "-c", SERVICE, str(config), str(port), str(pidfile)],
        "log": str(tmp_path / "production.log"), "start_grace_s": 0.3, "stop_grace_s": 5}))
    base = f"http://127.0.0.1:{port}"

    def serving() -> dict[str, object] | None:
        try:
            return httpx.get(base + "/flags", timeout=2, trust_env=False).json()
        except httpx.TransportError:
            return None

    def settle() -> None:
        from autotuner.deploy import wait_until_serving

        wait_until_serving(target, base + "/health", timeout_s=15, poll_s=0.05)

    def started() -> list[int]:
        text = pidfile.read_text() if pidfile.exists() else ""
        return [int(p) for p in text.split()]

    def alive() -> list[int]:
        return _alive(started())

    def cleanup() -> None:
        for pid in alive():  # only processes this test's service started, by PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return Deployed(kind, target, serving, settle, alive), cleanup


def _deployed(kind: str, tmp_path: Path) -> Iterator[Deployed]:
    deployed, cleanup = _build(kind, tmp_path)
    try:
        yield deployed
    finally:
        try:
            deployed.target.stop()
        finally:
            cleanup()


@pytest.fixture(params=KINDS)
def deployed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployed]:
    """Every deploy target."""
    yield from _deployed(str(request.param), tmp_path)


@pytest.fixture(params=SERVICE_KINDS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployed]:
    """Every deploy target that runs a service (all but `file`)."""
    yield from _deployed(str(request.param), tmp_path)


def _is_up_kind(deployed: Deployed) -> None:
    """None exactly for a target that runs nothing; a service target always knows whether it is up."""
    up = deployed.target.is_up()
    if deployed.serving is None:
        assert up is None
    else:
        assert isinstance(up, bool), up


# --- the live file ---------------------------------------------------------------------------------------


def test_a_target_is_a_deploy_target_of_its_kind(deployed: Deployed, tmp_path: Path) -> None:
    assert isinstance(deployed.target, DeployTarget)
    assert deployed.target.kind == deployed.kind
    assert deployed.config == tmp_path / "etc" / "tuned.yaml"


def test_nothing_is_live_before_the_first_write(deployed: Deployed) -> None:
    target = deployed.target
    assert target.current() is None
    assert target.restore_previous() is False  # nothing to roll back to
    assert target.current() is None
    assert not deployed.config.exists() and not deployed.previous.exists()
    assert target.is_up() is not True
    _is_up_kind(deployed)


def test_write_then_current_round_trips_the_flags(deployed: Deployed) -> None:
    deployed.target.write(A)
    assert deployed.target.current() == A
    assert not deployed.previous.exists()  # the first write replaced nothing
    deployed.target.write(B)
    assert deployed.target.current() == B


def test_the_file_is_byte_for_byte_what_render_config_gives(deployed: Deployed) -> None:
    deployed.target.write(A)
    assert deployed.config.read_bytes() == render_config(A).encode()
    deployed.target.write(B)
    assert deployed.config.read_bytes() == render_config(B).encode()
    assert deployed.previous.read_bytes() == render_config(A).encode()


def test_write_keeps_the_replaced_file_and_restore_previous_brings_it_back(deployed: Deployed) -> None:
    target = deployed.target
    target.write(A)
    target.write(B)
    target.write(B)  # a resumed deploy rewrites the live flags: the rollback target stays A
    assert target.restore_previous() is True
    assert target.current() == A
    assert target.restore_previous() is True  # a repeated rollback is the same rollback
    assert target.current() == A
    assert sorted(p.name for p in deployed.config.parent.iterdir()) == ["tuned.yaml", "tuned.yaml.previous"]


def test_a_live_file_that_is_not_a_mapping_is_a_deploy_error(deployed: Deployed) -> None:
    """A hand-edited file gone wrong is the user's to fix, said so, not a crash of the daemon's cycle."""
    deployed.config.write_text("- not\n- a mapping\n")
    with pytest.raises(DeployError, match="does not hold a mapping of vLLM option names; fix or remove it"):
        deployed.target.current()


def test_write_keeps_the_files_mode(deployed: Deployed) -> None:
    deployed.target.write(A)
    deployed.config.chmod(0o640)
    deployed.target.write(B)
    assert stat.S_IMODE(deployed.config.stat().st_mode) == 0o640
    assert stat.S_IMODE(deployed.previous.stat().st_mode) == 0o640


def test_lifecycle_calls_leave_the_files_alone_and_is_up_keeps_its_kind(deployed: Deployed) -> None:
    target = deployed.target
    target.write(A)
    target.write(B)
    files = {p: p.read_bytes() for p in (deployed.config, deployed.previous)}
    _is_up_kind(deployed)
    for step in (target.apply, target.stop, target.start, target.apply, target.stop):
        step()
        _is_up_kind(deployed)
        assert {p: p.read_bytes() for p in files} == files, step.__name__
    assert target.current() == B


# --- the service -----------------------------------------------------------------------------------------


def _serving(service: Deployed) -> dict[str, object] | None:
    assert service.serving is not None
    return service.serving()


def test_apply_runs_the_live_file_and_a_later_apply_the_newer_one(service: Deployed) -> None:
    target = service.target
    assert target.is_up() is False and _serving(service) is None
    target.write(A)
    target.apply()
    service.settle()
    assert target.is_up() is True
    assert _serving(service) == A
    target.write(B)
    assert _serving(service) == A  # a write alone changes nothing that runs
    target.apply()
    service.settle()
    assert target.is_up() is True
    assert _serving(service) == B


def test_stop_takes_the_service_down_repeatably_and_start_brings_it_back(service: Deployed) -> None:
    target = service.target
    target.write(A)
    target.apply()
    service.settle()
    target.stop()
    assert target.is_up() is False and _serving(service) is None
    target.stop()  # already down: nothing to do, no error
    assert target.is_up() is False
    target.write(B)
    target.start()
    service.settle()
    assert target.is_up() is True
    assert _serving(service) == B


def test_a_refused_config_is_an_error_in_the_services_words_and_rollback_recovers(service: Deployed) -> None:
    target = service.target
    target.write(A)
    target.apply()
    service.settle()
    target.write(REFUSED)
    with pytest.raises(DeployError) as failed:
        target.apply()
        service.settle()
    assert f"unrecognized arguments: --{REFUSED_KEY}" in str(failed.value)
    assert target.is_up() is False and _serving(service) is None
    assert target.restore_previous() is True
    target.apply()
    service.settle()
    assert target.is_up() is True
    assert _serving(service) == A


def test_nothing_of_the_service_is_left_once_stopped(service: Deployed) -> None:
    target = service.target
    target.write(A)
    target.apply()
    service.settle()
    target.apply()  # a restart: the first service must go, whole group
    service.settle()
    if service.kind == "command":
        assert len(service.alive()) == 2, "the service and its worker"
    target.stop()
    assert service.alive() == []
    assert EngineRegistry().entries() == []
    assert _serving(service) is None
    assert target.current() == A  # stopping is not rolling back
