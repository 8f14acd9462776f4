"""The simulator's state directory is refused when it is a symlink or someone else's; `autotuner sim
hold` places foreign memory on a simulated GPU, listed or (as in a container) not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotuner.monitor import NvmlMonitor
from autotuner.sim import nvml as sim_nvml
from autotuner.sim.gpu_state import STATE_DIR_ENV, GpuHost, SimStateDirError, make_gpus, state_dir_from_env
from tests.support.sim_gpus import hold

MIB = 1 << 20


def test_a_symlinked_state_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "gpus"
    link.symlink_to(target)
    monkeypatch.setenv(STATE_DIR_ENV, str(link))
    with pytest.raises(SimStateDirError, match=f"{link} is a symbolic link .*refusing to follow it"):
        state_dir_from_env()


def test_a_state_dir_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() == 0:
        theirs = tmp_path / "gpus"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")  # root's, certainly not ours
    monkeypatch.setenv(STATE_DIR_ENV, str(theirs))
    with pytest.raises(SimStateDirError, match=r"belongs to uid \d+, not to you"):
        state_dir_from_env()


def test_hold_refuses_a_symlinked_state_dir(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "gpus").symlink_to(target)
    done = subprocess.run([sys.executable, "-m", "autotuner.sim", "hold", "--gpu", "0", "--mib", "1"],
                          env={**os.environ, STATE_DIR_ENV: str(tmp_path / "gpus")}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "symbolic link" in done.stderr
    assert list(target.iterdir()) == []


def test_hold_places_listed_and_unlisted_foreign_memory(state_dir: Path) -> None:
    GpuHost(state_dir).ensure_inventory(make_gpus(state_dir, "NVIDIA GeForce RTX 3090", 24 << 30, 4))
    listed = hold(state_dir, "--gpu", "0", "--mib", "400")
    hidden = hold(state_dir, "--gpu", "2", "--mib", "300", "--unlisted")
    try:
        with NvmlMonitor(sim_nvml) as monitor:
            assert monitor.sample() == [400 * MIB, 0, 300 * MIB, 0]
            assert monitor.processes(0) == [(listed.pid, 400 * MIB)]
            assert monitor.processes(2) == []  # a container's view: memory in use, nobody listed
    finally:
        for proc in (listed, hidden):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
    deadline = time.monotonic() + 10
    host = GpuHost(state_dir)
    while time.monotonic() < deadline and host.used_bytes(0) + host.used_bytes(2):
        time.sleep(0.1)
    assert host.used_bytes(0) == host.used_bytes(2) == 0


def test_hold_on_a_gpu_the_box_lacks_is_bad_input(state_dir: Path) -> None:
    GpuHost(state_dir).ensure_inventory(make_gpus(state_dir, "NVIDIA GeForce RTX 3090", 24 << 30, 2))
    done = subprocess.run([sys.executable, "-m", "autotuner", "sim", "hold", "--gpu", "5", "--mib", "100"],
                          env={**os.environ, STATE_DIR_ENV: str(state_dir)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--gpu 5: the simulated box has GPUs 0-1" in done.stderr
