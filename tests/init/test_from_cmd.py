"""`autotuner init --from-cmd` as a user runs it: their real-looking command line becomes a scenario that
loads, with their flags fixed, the three knobs searched, and no secret copied; bad input exits 2 and
writes nothing; existing files are never overwritten without --force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autotuner.cli.app import app
from autotuner.daemon.config import load_config
from autotuner.engine.ports import free_port
from autotuner.scenario import load_scenario

SECRET = "sk-prod-4f9a8b7c6d5e"
USER_CMD = ("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 vllm serve meta-llama/Llama-2-13b-hf "
            "--tensor-parallel-size 8 --max-model-len 8192 --gpu-memory-utilization 0.92 "
            f"--max_num_batched_tokens=4096 --enforce-eager --no-enable-prefix-caching --api-key {SECRET} "
            "--host 0.0.0.0 --port 8001 --served-model-name llama-2-13b")


def init(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "init", *args], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())


def test_a_production_command_line_becomes_a_scenario(tmp_path: Path) -> None:
    done = init("--from-cmd", USER_CMD, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    scenario_file, daemon_file = tmp_path / "scenario.yaml", tmp_path / "autotuner-daemon.yaml"
    for path in (scenario_file, daemon_file):
        assert SECRET not in path.read_text()
    assert SECRET not in done.stdout + done.stderr
    assert "--api-key" in done.stdout and "VLLM_API_KEY" in done.stdout  # the user is told

    sc = load_scenario(scenario_file)
    assert sc.engine.kind == "vllm" and sc.engine.command_prefix() == ["vllm", "serve"]
    assert sc.engine.model == "meta-llama/Llama-2-13b-hf"
    assert sc.engine.served_model_name == "llama-2-13b"
    assert sc.engine.gpus == list(range(8))
    assert sc.engine.api_key_env == "VLLM_API_KEY"
    assert sc.engine.flags == {"tensor-parallel-size": 8, "max-model-len": 8192, "enforce-eager": True,
                               "enable-prefix-caching": False}
    assert sc.search_space is not None
    assert set(sc.search_space) == {"max-num-batched-tokens", "gpu-memory-utilization", "cpu-offload-gb"}
    assert sc.current_config == {"max-num-batched-tokens": 4096, "gpu-memory-utilization": 0.92,
                                 "cpu-offload-gb": 0.0}

    text = daemon_file.read_text()
    daemon = yaml.safe_load(text)
    assert daemon["scenario"] == "scenario.yaml"
    assert daemon["production"] == {"endpoint": "http://127.0.0.1:8001", "api_key_env": "VLLM_API_KEY"}
    # A target that can take production down and bring it back: the user's own command line, with the
    # three tuned flags moved into the --config file the daemon writes; no stop (the target stops the
    # running production process by its command line and port).
    config_path = daemon["deploy"]["config_path"]
    assert Path(config_path).is_absolute()
    assert daemon["deploy"] == {"kind": "command", "config_path": config_path, "start": [
        "vllm", "serve", "meta-llama/Llama-2-13b-hf", "--max-model-len", "8192", "--tensor-parallel-size", "8",
        "--no-enable-prefix-caching", "--enforce-eager", "--served-model-name", "llama-2-13b",
        "--host", "0.0.0.0", "--port", "8001", "--config", config_path]}
    assert SECRET not in " ".join(daemon["deploy"]["start"])
    assert "check: deploy.kind is command" in done.stdout
    assert "CUDA_VISIBLE_DEVICES" in done.stdout  # to be set in the daemon's environment
    # A cycle's bounds, each with a comment saying what it does; the header names the command.
    assert daemon["window"] == "01:00-06:00" and daemon["max_downtime"] == "30m"
    assert "# Re-tunes start and run only inside this daily window" in text
    assert "# The most one cycle may keep production down" in text
    assert text.splitlines()[0].endswith(f"run it with `autotuner daemon run {daemon_file}`.")
    # One study database, the scenario's: the daemon uses it when its own is unset.
    assert "storage" not in daemon
    assert sc.storage == f"sqlite:///{tmp_path.resolve() / 'autotuner.db'}"
    # It loads as `autotuner daemon run` reads it, and init checked that a cycle can complete.
    loaded = load_config(daemon_file)
    assert loaded.config.max_downtime_s == 1800 and loaded.config.deploy.kind == "command"
    assert "check: cycle: window: 01:00-06:00" in done.stdout
    assert "check: cycle: rollout: deploy through the command target" in done.stdout
    assert "cannot complete" not in done.stdout


def test_a_config_file_on_the_command_line_is_read_and_left_alone(tmp_path: Path) -> None:
    config = tmp_path / "prod.yaml"
    config.write_text("max_num_seqs: 128\ngpu-memory-utilization: 0.85\n")
    done = init("--from-cmd", f"python3 -m vllm.entrypoints.openai.api_server --model /models/m -tp 2 "
                f"--config {config} --gpu-memory-utilization 0.9", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    sc = load_scenario(tmp_path / "out" / "scenario.yaml")
    assert sc.engine.command_prefix() == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert sc.engine.flags == {"max-num-seqs": 128, "tensor-parallel-size": 2}
    assert sc.current_config["gpu-memory-utilization"] == 0.9  # the command line wins over the file
    daemon = yaml.safe_load((tmp_path / "out" / "autotuner-daemon.yaml").read_text())
    assert daemon["deploy"]["config_path"] == str((tmp_path / "out" / "vllm-tuned.yaml").resolve())
    assert f"your command reads --config {config}" in done.stdout
    assert config.read_text() == "max_num_seqs: 128\ngpu-memory-utilization: 0.85\n"  # the user's file untouched
    # What init writes is what `autotuner daemon run` reads.
    loaded = load_config(tmp_path / "out" / "autotuner-daemon.yaml")
    assert loaded.scenario.engine.flags == sc.engine.flags


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text("# mine\n")
    done = init("--from-cmd", "vllm serve m -tp 2", "--out", str(tmp_path))
    assert done.returncode == 2
    assert str(tmp_path / "scenario.yaml") in done.stderr and "--force" in done.stderr
    assert (tmp_path / "scenario.yaml").read_text() == "# mine\n"
    assert not (tmp_path / "autotuner-daemon.yaml").exists()
    forced = init("--from-cmd", "vllm serve m -tp 2", "--out", str(tmp_path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert load_scenario(tmp_path / "scenario.yaml").engine.flags == {"tensor-parallel-size": 2}


@pytest.mark.parametrize(("args", "says"), [
    (["--from-cmd", "vllm serve m --tensor-paralel-size 8"], "Did you mean --tensor-parallel-size"),
    (["--from-cmd", "vllm serve m --max-model-len lots"], "--max-model-len"),
    (["--from-cmd", "vllm serve m --gpu-memory-utilization 1.5"], "gpu_memory_utilization"),
    (["--from-cmd", "vllm serve 'm --port 8000"], "cannot split"),
    (["--from-cmd", "docker compose up vllm"], "not a vLLM server command"),
    (["--from-cmd", "vllm serve --port 8000"], "no model"),
    ([], "--from-cmd"),
    (["--from-cmd", "vllm serve m", "--api-key-env", "sk-literal-key-value"], "NAME of an environment variable"),
])
def test_bad_command_lines_exit_2_and_write_nothing(tmp_path: Path, args: list[str], says: str) -> None:
    # In process (the same typer app the console script runs): a process per case would cost seconds each.
    done = CliRunner().invoke(app, ["init", *args, "--out", str(tmp_path / "out")])
    assert done.exit_code == 2, done.output
    assert says in done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.output
    assert not (tmp_path / "out").exists()
    assert "sk-literal-key-value" not in done.stderr


def test_an_unreachable_endpoint_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = init("--from-endpoint", url, "--out", str(tmp_path))
    assert done.returncode == 2
    assert url in done.stderr and "ConnectError" in done.stderr
    assert list(tmp_path.iterdir()) == []
