"""The daemon's side of a cycle: begun for a trigger, driven by a CycleDriver (cycle.py) to its end or its park,
and what production's watch learns from its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotuner.daemon.cycle import CycleDriver
from autotuner.daemon.cycle_context import CycleContext
from autotuner.daemon.evidence import served_evidence
from autotuner.daemon.fleet_hooks import fleet_cycle_ended
from autotuner.daemon.state import DEPLOYED, DONE, Cycle
from autotuner.daemon.triggers import Trigger, identity
from autotuner.watch.snapshot import GpuInfo, ProductionSnapshot

if TYPE_CHECKING:
    from autotuner.daemon.loop import Daemon


async def start_cycle(daemon: Daemon, trigger: Trigger, snap: ProductionSnapshot, gpus: tuple[GpuInfo, ...]) -> None:
    # Production's served window is the twin's evidence: read (the live config, the space) only for it.
    served = served_evidence(daemon.watch.served_window(), daemon.target.current(), daemon.production_scenario()) \
        if daemon.config.tune.twin else {}
    cycle = daemon.states.begin(trigger.kind, {**trigger.evidence, **served}, identity(snap, gpus))
    await drive(daemon, cycle)


async def drive(daemon: Daemon, cycle: Cycle) -> None:
    from autotuner.engine.registry import autotuner_home

    assert daemon.stopping is not None
    scenario = daemon.loaded.scenario
    ctx = CycleContext(daemon.keeper, daemon.chain, daemon.refusals, daemon.runtime, daemon.notify, daemon.own_traffic,
                       daemon.fleet)
    daemon.driver = CycleDriver(daemon.loaded, daemon.states, daemon.store, daemon.target, daemon.stopping,
                                autotuner_home() / "logs" / f"{scenario.name}-daemon", ctx)
    daemon.active = cycle
    try:
        cycle = await daemon.driver.run(cycle)
    finally:
        daemon.driver = None
        daemon.active = None
    if cycle.state != DONE:
        return  # parked: the next poll drives it again
    if daemon.fleet is not None:
        fleet_cycle_ended(daemon, cycle)
    daemon.noted.clear()
    if cycle.outcome == DEPLOYED:  # else the trigger stands and fires again after the backoff
        await refresh_reference(daemon, cycle)
    restarted = cycle.candidate_flags is not None or bool((cycle.scenario or {}).get("drain"))
    daemon.watch.forget(restarted=restarted)


async def refresh_reference(daemon: Daemon, cycle: Any) -> None:
    """After a cycle, production as it now runs is the yardstick (so a swap fires once, not forever)."""
    snap, gpus = await daemon.observe()
    if snap.reachable:
        ref = identity(snap, gpus)
        ref["study"] = cycle.study_name
        daemon.states.set_reference(ref)
