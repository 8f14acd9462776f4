"""The registry of engine backends: the names `engine.kind` takes (the schema's `EngineKind`,
engine_kinds.py), mapped to their backend objects.

This is the one module that compares anything to the kind strings; everything else asks
`backend_for(...)`. A test (tests/backends) keeps it so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotuner.backends.base import Backend
from autotuner.backends.sim import SimBackend, VirtualBackend
from autotuner.backends.vllm import VllmBackend
from autotuner.engine_kinds import ENGINE_KINDS
from autotuner.errors import ScenarioError

if TYPE_CHECKING:
    from autotuner.scenario import EngineSettings, Scenario

VLLM: Backend = VllmBackend("vllm")
SIM: Backend = SimBackend("sim")
SIM_VIRTUAL: Backend = VirtualBackend("sim-virtual")
BACKENDS: dict[str, Backend] = {b.name: b for b in (VLLM, SIM, SIM_VIRTUAL)}
assert tuple(BACKENDS) == ENGINE_KINDS


def _one_of() -> str:
    names = [repr(k) for k in ENGINE_KINDS]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def backend_for(kind_or_engine: str | EngineSettings | Scenario) -> Backend:
    """The backend of a kind name, an engine's settings or a scenario (its engine's). An unknown kind
    is bad input, worded as the scenario's validation words it."""
    if isinstance(kind_or_engine, str):
        kind: object = kind_or_engine
    elif hasattr(kind_or_engine, "engine"):
        kind = kind_or_engine.engine.kind
    else:
        kind = kind_or_engine.kind
    backend = BACKENDS.get(kind) if isinstance(kind, str) else None
    if backend is None:
        raise ScenarioError(f"engine.kind: must be one of {_one_of()}, got {kind!r}")
    return backend
