"""Must production stop for a cycle's tune? Only when the tune needs production's GPUs: never for an engine
in virtual time, not when the scenario's GPUs are disjoint from production's, and not when enough idle GPUs
sit beside production (the tune is moved there)."""

from __future__ import annotations

from typing import Any

from autotuner.deploy import DeployTarget
from autotuner.scenario import Scenario


def drain_plan(scenario: Scenario, config: Any, target: DeployTarget) -> tuple[bool, str]:
    """(must production stop for this tune, why)."""
    from autotuner.backends import backend_for

    if not backend_for(scenario).uses_box_gpus:
        return False, "the scenario's engine runs in virtual time: production keeps serving"
    ours, theirs = scenario.engine.gpus, config.production.gpus
    if ours and theirs and not set(ours) & set(theirs):
        return False, f"the tune runs on GPUs {ours}, production on {theirs}: production keeps serving"
    if not target.can_take_down:
        return True, ("the tune needs production's GPUs and the deploy target cannot take production down "
                      "(a file target without stop/start)")
    return True, "the tune needs production's GPUs: production stops for it"


# A GPU with less than this in use counts as idle (a desktop's Xorg, a stray context).
IDLE_GPU_BYTES = 1 << 30


def spare_gpus(scenario: Scenario, production_gpus: list[int] | None) -> list[int] | None:
    """GPUs the tune may use beside production: idle ones outside `production.gpus`, as many as the
    scenario's engine needs (TP × PP); None when production's GPUs are not named or too few are idle."""
    from autotuner.watch.inventory import gpu_used_bytes

    if production_gpus is None or scenario.engine.gpus:
        return None
    pp = scenario.engine.flags.get("pipeline-parallel-size", 1)
    need = scenario.tensor_parallel_size() * (int(pp) if isinstance(pp, int | float) else 1)
    try:
        gpus = gpu_used_bytes()
    except Exception:  # no NVML: nothing known to be idle
        return None
    idle = [g.index for g, used in gpus if g.index not in production_gpus and used < IDLE_GPU_BYTES]
    return idle[:need] if len(idle) >= need else None
