"""What every step of a cycle shares: the daemon's stores and hooks (CycleContext), the scenario the cycle
tunes (the configured one with the trigger's changes applied), and the two ways out of a step: a failure goes
through ROLLBACK, a stop ends the cycle as skipped. The steps are in cycle.py (detect, window, drain),
cycle_search.py (tune, confirm) and cycle_deploy.py (proposal, deploy, verify, rollback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from autotuner.daemon.config import LoadedConfig
from autotuner.daemon.fingerprints import box_fingerprint, refusal_fingerprint
from autotuner.daemon.keeper import Keeper
from autotuner.daemon.known_good import KnownGoodChain
from autotuner.daemon.refusals import Refusals
from autotuner.daemon.runtime import RuntimeStore
from autotuner.daemon.state import DONE, ROLLBACK, SKIPPED, STOP_REASON, Cycle, CycleStore
from autotuner.deploy import DeployTarget
from autotuner.fleet.coordinator import ADOPT_TRIGGER, Fleet
from autotuner.scenario import Scenario
from autotuner.store.db import Store

log = structlog.get_logger("autotuner.daemon")


# --- the scenario a cycle tunes ----------------------------------------------------------------------

def apply_changes(scenario: Scenario, changes: dict[str, Any]) -> Scenario:
    data = scenario.model_dump(mode="json", exclude={"storage"})
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return Scenario.model_validate({**data, "source": scenario.source})


@dataclass
class CycleContext:
    """What a cycle needs beyond its config: the daemon's stores, the keeper, and its hooks."""

    keeper: Keeper
    chain: KnownGoodChain
    refusals: Refusals
    runtime: RuntimeStore
    notify: Callable[[str, str, dict[str, Any]], None]
    own_traffic: Callable[[float, float], None]
    fleet: Fleet | None = None


class CycleSteps:
    """The state all of a cycle's steps share (one object: a SIGHUP replaces `config` mid-cycle and every
    step reads the new one). CycleDriver (cycle.py) is every step group at once."""

    def __init__(self, loaded: LoadedConfig, states: CycleStore, store: Store, target: DeployTarget,
                 stopping: asyncio.Event, log_dir: Path, ctx: CycleContext,
                 now: Callable[[], datetime] = datetime.now) -> None:
        self.config = loaded.config
        self.base = loaded.scenario
        self.states = states
        self.store = store
        self.target = target
        self.stopping = stopping
        self.log_dir = log_dir
        self.ctx = ctx
        self.now = now
        self.tuner: Any = None
        self.lease_lost = False
        self.study: str | None = None  # the study this cycle tunes, once named

    def scenario_of(self, cycle: Cycle) -> Scenario:
        return apply_changes(self.base, (cycle.scenario or {}).get("changes", {}))

    def fingerprint(self, cycle: Cycle) -> str:
        return refusal_fingerprint(cycle.observed, self.scenario_of(cycle))

    def fingerprints(self, cycle: Cycle) -> tuple[str, str]:
        """What a refusal is looked up under: this box and workload, and this box whatever the workload."""
        return self.fingerprint(cycle), box_fingerprint(cycle.observed)

    def _fail(self, cycle: Cycle, reason: str) -> Cycle:
        log.warning("daemon.cycle_failed", cycle=cycle.id, state=cycle.state, reason=reason)
        return self.states.transition(cycle, ROLLBACK, {"reason": reason}, reason=reason)

    def _stopping(self, cycle: Cycle) -> Cycle:
        return self.states.transition(cycle, DONE, {"reason": STOP_REASON}, outcome=SKIPPED, reason=STOP_REASON)

    def _adopts(self, cycle: Cycle) -> bool:
        """The group's winner, tuned on an identical box: deployed and verified here, never re-tuned."""
        return cycle.trigger_kind == ADOPT_TRIGGER
