"""`kind: command` with real processes: the simulator as production (`autotuner sim serve --config` of the
deployed file), a daemonizing start with stop/status commands, failures told with exit code and output,
and no orphan left, even when the process that started production is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from autotuner.deploy import CommandTarget, DeployError, make_target, parse_deploy_spec, wait_until_serving
from autotuner.engine.ports import free_port
from autotuner.engine.registry import EngineRegistry

PRODUCTION = {"tensor-parallel-size": 8, "max-model-len": 8192, "gpu-memory-utilization": 0.8,
              "max-num-batched-tokens": 1024, "served-model-name": "prod"}


def sim_target(tmp_path: Path, port: int, **extra: object) -> CommandTarget:
    config = tmp_path / "tuned.yaml"
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(config),
        "start": [sys.executable, "-m", "autotuner", "sim", "serve", "llama-2-13b", "--config", str(config),
                  "--port", str(port), "--sim-speedup", "50"],
        "log": str(tmp_path / "production.log"), "start_grace_s": 2, "stop_grace_s": 10, **extra})
    target = make_target(spec)
    assert isinstance(target, CommandTarget)
    return target


def served(port: int) -> dict[str, object]:
    data = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
    return {"id": data[0]["id"], "max_model_len": data[0]["max_model_len"]}


def group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return alive


def test_deploy_refused_config_then_roll_back_with_the_simulator_as_production(sim_state: Path, tmp_path: Path) -> None:
    port = free_port()
    target = sim_target(tmp_path, port)
    health = f"http://127.0.0.1:{port}/health"
    try:
        assert target.is_up() is False
        target.write(PRODUCTION)
        target.apply()
        wait_until_serving(target, health, timeout_s=60)
        assert served(port) == {"id": "prod", "max_model_len": 8192}
        first_pid = target.child_pid
        assert first_pid is not None and target.is_up() is True
        assert [e.pgid for e in EngineRegistry().entries()] == [first_pid]

        # A candidate the engine refuses (an option vLLM does not know): the deploy fails with its words.
        target.write({**PRODUCTION, "max-model-len": 4096, "no-such-option": 1})
        with pytest.raises(DeployError) as failed:
            target.apply()
            wait_until_serving(target, health, timeout_s=60)
        message = str(failed.value)
        assert "exited with code 2" in message and "unrecognized arguments: --no-such-option" in message
        assert str(tmp_path / "production.log") in message
        assert group_alive(first_pid) == []  # the old production was stopped, whole group
        assert target.is_up() is False

        # Rollback: the previous file back, the service restarted on it.
        assert target.restore_previous() is True
        assert target.current() == PRODUCTION
        target.apply()
        wait_until_serving(target, health, timeout_s=60)
        assert served(port) == {"id": "prod", "max_model_len": 8192}
        second_pid = target.child_pid
        assert second_pid is not None and second_pid != first_pid
    finally:
        target.stop()
    assert target.is_up() is False
    assert group_alive(second_pid) == []
    assert EngineRegistry().entries() == []


def test_a_killed_daemon_leaves_production_that_the_next_start_reaps(sim_state: Path, tmp_path: Path) -> None:
    """The process that started production dies by SIGKILL; production (its supervised child, in its own
    process group) outlives it. The next start stops that orphan before starting anew: one production."""
    port = free_port()
    config = tmp_path / "tuned.yaml"
    owner = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from autotuner.deploy import make_target, parse_deploy_spec, wait_until_serving
        spec = parse_deploy_spec({{"kind": "command", "config_path": {str(config)!r},
            "start": [sys.executable, "-m", "autotuner", "sim", "serve", "llama-2-13b", "--config", {str(config)!r},
                      "--port", "{port}", "--sim-speedup", "50"],
            "log": {str(tmp_path / "production.log")!r}, "start_grace_s": 1}})
        target = make_target(spec)
        target.write({PRODUCTION!r})
        target.apply()
        wait_until_serving(target, "http://127.0.0.1:{port}/health", 60)
        print(target.child_pid, flush=True)
        time.sleep(600)
    """)
    daemon = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None
    orphan = int(daemon.stdout.readline())
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    assert group_alive(orphan), "production died with its owner: it is not a separate process group"
    assert served(port)["id"] == "prod"

    target = sim_target(tmp_path, port)
    try:
        target.start()
        assert group_alive(orphan) == []
        wait_until_serving(target, f"http://127.0.0.1:{port}/health", timeout_s=60)
        assert target.child_pid not in (None, orphan)
    finally:
        target.stop()
    assert EngineRegistry().entries() == []


DAEMONIZE = textwrap.dedent("""
    import subprocess, sys
    # Detach a long-running service (its own session) and exit 0, as `docker run -d` or an init script does.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    open(sys.argv[1], "w").write(str(proc.pid))
""")
STOP = "import os, signal, sys; os.kill(int(open(sys.argv[1]).read()), signal.SIGTERM)"
STATUS = "import os, sys, psutil; p = psutil.Process(int(open(sys.argv[1]).read())); " \
         "sys.exit(0 if p.status() != psutil.STATUS_ZOMBIE else 1)"


def test_a_daemonizing_start_is_managed_by_its_stop_and_status_commands(tmp_path: Path) -> None:
    pidfile = str(tmp_path / "service.pid")
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(tmp_path / "tuned.yaml"),
        "start": [sys.executable, "-c", DAEMONIZE, pidfile], "stop": [sys.executable, "-c", STOP, pidfile],
        "status": [sys.executable, "-c", STATUS, pidfile]})
    target = make_target(spec)
    target.write(PRODUCTION)
    target.apply()
    try:
        service = psutil.Process(int(Path(pidfile).read_text()))
        assert target.is_up() is True
        assert EngineRegistry().entries() == []  # not a child of ours: never reaped as an orphan
        target.apply()  # restart: stop, then start a new one
        restarted = int(Path(pidfile).read_text())
        assert restarted != service.pid
        psutil.wait_procs([service], timeout=10)
        assert not service.is_running() or service.status() == psutil.STATUS_ZOMBIE
    finally:
        target.stop()
    assert target.is_up() is False


def test_a_start_that_fails_says_its_exit_code_and_output(tmp_path: Path) -> None:
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(tmp_path / "tuned.yaml"),
        "start": [sys.executable, "-c", "import sys; print('ValueError: max_num_batched_tokens too small'); "
                  "sys.exit(3)"],
        "log": str(tmp_path / "start.log"), "start_grace_s": 30})
    target = make_target(spec)
    with pytest.raises(DeployError, match=r"exited with code 3; last output: ValueError: max_num_batched_tokens "
                                          r"too small \(full log: .*start\.log\)"):
        target.apply()
    assert EngineRegistry().entries() == []


def test_a_stop_command_that_fails_names_it_and_its_stderr(tmp_path: Path) -> None:
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(tmp_path / "tuned.yaml"), "start": ["true"],
        "stop": [sys.executable, "-c", "import sys; sys.stderr.write('unit not loaded\\n'); sys.exit(5)"]})
    with pytest.raises(DeployError, match=r"stop: `.*` exited with code 5; last stderr: unit not loaded\. fix the "
                                          "stop command"):
        make_target(spec).stop()


def test_a_program_that_does_not_exist(tmp_path: Path) -> None:
    spec = parse_deploy_spec({"kind": "command", "config_path": str(tmp_path / "tuned.yaml"),
                              "start": [str(tmp_path / "no-such-vllm"), "serve"]})
    with pytest.raises(DeployError, match=r"start: cannot run .*no-such-vllm.*give an executable"):
        make_target(spec).start()


def test_a_failing_stop_command_still_ends_a_supervised_service(tmp_path: Path) -> None:
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(tmp_path / "tuned.yaml"), "start_grace_s": 0.5,
        "start": [sys.executable, "-c", "import subprocess, sys, time; "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"],
        "stop": [sys.executable, "-c", "import sys; sys.exit(1)"]})
    target = make_target(spec)
    assert isinstance(target, CommandTarget)
    target.start()
    pgid = target.child_pid
    assert pgid is not None and target.is_up() is True
    deadline = time.monotonic() + 30
    while len(group_alive(pgid)) < 2:  # the service and the worker it forked
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    target.stop()  # the stop command fails; the group goes down by signals, worker included
    assert group_alive(pgid) == []
    assert target.is_up() is False
    assert EngineRegistry().entries() == []
