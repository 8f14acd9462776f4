"""Fixtures of the fault cases; the scenarios and checks they use are in tests/support/faults.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_state: Path) -> Path:
    """Private AUTOTUNER_HOME (engine registry, logs) and simulated GPUs for this case."""
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOTUNER_SIM_RELEASE_DELAY_S", "0.2")
    return tmp_path / "home"
