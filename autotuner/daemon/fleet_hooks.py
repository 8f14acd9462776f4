"""The daemon's reports to its fleet (fleet/coordinator.py): where this box stands at each poll, and what the
group learns from the end of this box's cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotuner.daemon.state import DEPLOYED, Cycle
from autotuner.fleet.coordinator import ADOPT_TRIGGER, ROLLOUT_ID
from autotuner.fleet.membership import group_keys

if TYPE_CHECKING:
    from autotuner.daemon.loop import Daemon


def fleet_heartbeat(daemon: Daemon, ref: dict[str, Any], reachable: bool) -> None:
    assert daemon.fleet is not None
    daemon.fleet.place(*group_keys(ref, daemon.production_scenario()))
    deployed = daemon.states.last_deployed()
    cert = deployed.certificate if deployed is not None else None
    summary = None if cert is None else {"study": cert.get("study"), "trial": cert.get("trial"),
                                         "lines": (cert.get("lines") or [])[:3]}
    daemon.fleet.heartbeat(daemon.target.current(), summary, reachable and daemon.runtime.get().alarm is None)


def fleet_cycle_ended(daemon: Daemon, cycle: Cycle) -> None:
    """What the group learns from this box's cycle: an adoption's end, or a tune's winner (published
    once deployed and verified here) or its failure (the claim released for another box)."""
    assert daemon.fleet is not None
    ok = cycle.outcome == DEPLOYED
    if cycle.trigger_kind == ADOPT_TRIGGER:
        daemon.fleet.adoption_ended(int(cycle.evidence[ROLLOUT_ID]), ok, None if ok else cycle.reason)
    elif "fleet" in cycle.evidence:  # a tune the fleet gave this box
        daemon.fleet.tune_ended(ok, cycle.reason, cycle.candidate_flags, cycle.certificate, cycle.study_name,
                                cycle.candidate_trial, daemon.foreign_memory() if ok else None)
