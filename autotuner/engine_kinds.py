"""The engine kinds a scenario's `engine.kind` names, and what the schema itself needs of each: the
command that starts it when engine.command names none, and whether it runs the simulated vLLM (then
engine.model and engine.sim.gpu are catalog entries, read when the scenario is loaded).

The schema's own, below every backend: scenario.py validates with it and imports no backend;
backends/kinds.py maps each kind to its backend object, whose `default_command()` and `simulated`
are read from here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from autotuner.vllm.cmdline import SERVE_COMMAND

EngineKind = Literal["vllm", "sim", "sim-virtual"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
# The simulated vLLM's server, as this interpreter runs it.
SIMULATOR_COMMAND = (sys.executable, "-m", "autotuner.sim", "serve")


@dataclass(frozen=True)
class KindSchema:
    default_command: tuple[str, ...]  # the argv prefix before the model when engine.command is unset
    simulated: bool  # the simulated vLLM: a catalog model on a catalog GPU, not a real engine
    # Replays a trace's prompts; sim-virtual evaluates token counts in virtual time, never text.
    replays_traces: bool = True


KINDS: Mapping[str, KindSchema] = {
    "vllm": KindSchema(SERVE_COMMAND, simulated=False),
    "sim": KindSchema(SIMULATOR_COMMAND, simulated=True),
    "sim-virtual": KindSchema(SIMULATOR_COMMAND, simulated=True, replays_traces=False),
}
assert tuple(KINDS) == ENGINE_KINDS
