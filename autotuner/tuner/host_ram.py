"""Host RAM that a CPU offload pins: the figure vLLM pins per GiB offloaded, and the check before a
launch that an offload fits in the host RAM available now.

Below trust (which reports a requested offload that did not happen) and beside the search space
(which bounds the offload axis with the same figure): both read it here.
"""

from __future__ import annotations

from collections.abc import Mapping

import psutil

from autotuner.backends import backend_for
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue

# Host RAM vLLM pins per GiB of --cpu-offload-gb, on each tensor-parallel worker (vLLM #56410).
PINNED_HOST_PER_GIB = 1.9


def host_ram_problem(scenario: Scenario, flags: Mapping[str, FlagValue], available: int | None = None) -> str | None:
    """Before a launch: would this offload pin more host RAM than is available now? (None: it fits.)"""
    gb = float(flags.get("cpu-offload-gb") or 0)  # type: ignore[arg-type]
    if gb <= 0 or not backend_for(scenario).checks_host_ram:
        return None
    tp = scenario.tensor_parallel_size()
    need = gb * PINNED_HOST_PER_GIB * tp * (1 << 30)
    free = available if available is not None else psutil.virtual_memory().available
    if need <= free:
        return None
    return (f"--cpu-offload-gb {gb:g} pins about {need / 2**30:.1f} GiB of host RAM ({PINNED_HOST_PER_GIB}x per GPU "
            f"x TP {tp}, vLLM #56410), but only {free / 2**30:.1f} GiB is available")
