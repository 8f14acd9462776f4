"""How the check starts its own children (a step, the hog): the same interpreter running
``-m tools.gpu_check``, with this repository on PYTHONPATH whatever directory the check was started
from, so that ``tools`` and ``autotuner`` import there as they did here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def self_command(*args: str) -> list[str]:
    """The argv of a child running this check's own entry point with `args`."""
    return [sys.executable, "-m", "tools.gpu_check", *args]


def repository_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the repository appended to PYTHONPATH where it is not there already."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPOSITORY) in paths:
        return env
    return {**env, "PYTHONPATH": os.pathsep.join([*paths, str(REPOSITORY)])}
