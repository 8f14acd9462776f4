"""Engine backends: one object per engine kind (`vllm`, `sim`, `sim-virtual`) that answers every
question depending on the kind; `backend_for(scenario)` finds it (see base.py for the questions).

Light to import: no simulator, tuner or monitor module is loaded here (they are imported where used).
"""

from autotuner.backends.base import Backend
from autotuner.backends.registry import BACKENDS, ENGINE_KINDS, SIM, SIM_VIRTUAL, VLLM, EngineKind, backend_for

__all__ = ["BACKENDS", "ENGINE_KINDS", "SIM", "SIM_VIRTUAL", "VLLM", "Backend", "EngineKind", "backend_for"]
