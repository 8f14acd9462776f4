"""Simulated GPUs as the tests set them up: the box the monitor tests run on (GPU_NAME, GPU_TOTAL: RTX 3090s
of 24 GiB, built by the fixtures of tests/monitor/conftest.py) and `hold`, which starts `autotuner sim hold`
to place foreign memory on a simulated GPU (as another user's process would) and returns once it is held.
The sim, monitor and tuner tests all use them, so they live here rather than in a conftest or a test module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autotuner.sim.gpu_state import STATE_DIR_ENV

GIB = 1 << 30
GPU_NAME = "NVIDIA GeForce RTX 3090"
GPU_TOTAL = 24 * GIB


def hold(state: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "autotuner", "sim", "hold", *args],
                            env={**os.environ, STATE_DIR_ENV: str(state)}, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert f"as pid {proc.pid}" in line, line
    return proc
