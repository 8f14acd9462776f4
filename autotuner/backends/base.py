"""The one question-answering seam for the engine kind: `Backend`, the abstract base every engine
backend (`vllm`, `sim`, `sim-virtual`) implements.

Everything in autotuner that depends on `engine.kind` asks the scenario's backend (`backend_for`)
instead of comparing the kind to a string: which trial runner measures a candidate, which memory
monitor watches it, which extra argv the engine takes, how the study key names the engine, the GPUs
and the model, and which preflight and offload checks apply.

Imports: of autotuner only the schema's engine kinds at the top (tuner.runner and store import this
package, so a top-level import of theirs here would be a cycle); implementations import what they
need inside their methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.engine_kinds import KINDS

if TYPE_CHECKING:
    from autotuner.monitor.factory import MonitorKind
    from autotuner.scenario import Scenario
    from autotuner.tuner.runners import TrialRunner
    from autotuner.vllm import FlagValue


class Backend(ABC):
    """What one engine kind is. The flags are class attributes (`simulated`, the schema's, is read from
    engine_kinds); the methods take the scenario."""

    #: a trial starts an engine process (writes its log); False: evaluated in this process, virtual time
    runs_process: bool
    #: trials run on GPUs of this box (real, or the simulator's state directory) watched by a monitor;
    #: False: no GPU of ours is used, so there is nothing to lock, watch or split into groups
    uses_box_gpus: bool
    #: flags autotuner does not know are passed on unchecked (vLLM); False: they are refused
    accepts_unknown_flags: bool
    #: the host RAM that cpu-offload pins is the real host's, so host-RAM checks apply
    checks_host_ram: bool
    #: the host RAM the offload range is sized by when it is not the real host's (None: the real host's)
    simulated_host_bytes: int | None

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<backend {self.name}>"

    @property
    def simulated(self) -> bool:
        """The engine runs the simulated vLLM (a simulated box, model preset, host), not a real engine."""
        return KINDS[self.name].simulated

    def default_command(self) -> list[str]:
        """The argv prefix before the model when the scenario names no engine.command."""
        return list(KINDS[self.name].default_command)

    @abstractmethod
    def trial_runner(self, scenario: Scenario, log_dir: Path, first_run: int = 0) -> TrialRunner:
        """The runner that measures one candidate; `first_run`: the first noise draw (virtual time)."""

    def monitor_kind(self, configured: MonitorKind) -> MonitorKind:
        """The memory monitor kind a trial opens for the scenario's `monitor.kind`."""
        return configured

    def prepare_gpus(self, scenario: Scenario) -> None:
        """Make the box's GPUs exist before they are watched (the simulator's state); no-op elsewhere."""
        return None

    def box_gpu_indices(self, scenario: Scenario) -> list[int] | None:
        """The box's GPUs when known without opening a monitor (the simulated box); None: ask the monitor."""
        return None

    @abstractmethod
    def argv_extras(self, scenario: Scenario, run: int | None = None) -> list[str]:
        """Arguments after vLLM's flags: the simulator's `--sim-*` for its process (`sim`) or its
        evaluator (`sim-virtual`, with `run`, the noise draw); none for vLLM."""

    @abstractmethod
    def default_limits(self, scenario: Scenario, flags: Mapping[str, FlagValue]) -> tuple[object, object]:
        """(max-model-len, max-num-seqs) the engine picks for these flags where we can know it, else None."""

    @abstractmethod
    def engine_version(self, scenario: Scenario) -> str:
        """The engine's version as the study key records it."""

    @abstractmethod
    def gpu_inventory(self, scenario: Scenario) -> list[str]:
        """The GPUs as the study key records them, one line per GPU."""

    @abstractmethod
    def model_fingerprint(self, scenario: Scenario) -> str:
        """The model's shape and weights' identity for the study key."""
