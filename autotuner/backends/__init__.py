"""Engine backends: one object per engine kind (`vllm`, `sim`, `sim-virtual`) that answers every
question depending on the kind; `backend_for(scenario)` finds it (see base.py for the questions). The
kinds themselves are the scenario schema's (engine_kinds.py).

Light to import: no simulator, tuner or monitor module is loaded here (they are imported where used).
"""

from autotuner.backends.base import Backend
from autotuner.backends.kinds import BACKENDS, SIM, SIM_VIRTUAL, VLLM, backend_for

__all__ = ["BACKENDS", "SIM", "SIM_VIRTUAL", "VLLM", "Backend", "backend_for"]
