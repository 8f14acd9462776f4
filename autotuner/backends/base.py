"""The one question-answering seam for the engine kind: `Backend`, the abstract base every engine
backend (`vllm`, `sim`, `sim-virtual`) implements.

Everything in autotuner that depends on `engine.kind` asks the scenario's backend (`backend_for`)
instead of comparing the kind to a string: whether a trial runs an engine process (the tuner picks its
runner by that), which memory monitor watches it, which extra argv the engine takes, how the study key
names the engine, the GPUs and the model, and which preflight and offload checks apply.

Layer: above the parts it composes (engine, monitor, sim, catalog), below analysis and the tuner, which
ask it; so it never imports them. The simulator is imported inside methods: the CLI's start does not
load it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from autotuner.engine_kinds import KINDS
from autotuner.monitor import MemoryMonitor, open_monitor

if TYPE_CHECKING:
    from autotuner.monitor.factory import MonitorKind
    from autotuner.scenario import Scenario
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

    def monitor(self, scenario: Scenario, root_pid: Callable[[], int | None] | None = None) -> MemoryMonitor:
        """The memory monitor of the scenario's GPUs, as this backend watches them (the box's GPUs made
        to exist first where they are simulated)."""
        self.prepare_gpus(scenario)
        return open_monitor(self.monitor_kind(scenario.monitor.kind), scenario.engine.gpus, root_pid=root_pid)

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
