"""One cycle, step by step, each step persisted before it runs (state.py): take production down (the
scenario's GPUs are production's), tune warm-started from this deployment's last study, confirm and soak,
deploy the winner, verify production with the scenario's long prompts; roll back when any of it fails.
Production is never left down: every way out of a cycle that took it down goes through ROLLBACK, which puts
the previous config back up and verifies it.

A step that was in flight when the daemon was killed is run again on restart; each one is written so that
running it twice is the same as running it once (the target's file is written atomically and compared
before it is written again, the tuner resumes its study).

The steps live by group: this module's (detect, window, drain) and the driver, cycle_search.py (tune,
confirm), cycle_deploy.py (proposal, deploy, verify, rollback); what they share is in cycle_context.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from autotuner.daemon.cycle_context import apply_changes
from autotuner.daemon.cycle_deploy import DeploySteps
from autotuner.daemon.cycle_search import SearchSteps
from autotuner.daemon.drain import drain_plan, spare_gpus
from autotuner.daemon.evidence import tune_changes
from autotuner.daemon.state import (
    CONFIRM,
    DEPLOY,
    DETECT,
    DONE,
    DRAIN,
    PROPOSED,
    ROLLBACK,
    SKIPPED,
    TUNE,
    VERIFY,
    WINDOW,
    Cycle,
)
from autotuner.deploy import DeployError
from autotuner.errors import UserInputError
from autotuner.fleet.coordinator import WARM_START


class CycleDriver(SearchSteps, DeploySteps):
    """Runs a cycle from whatever state it is in to DONE, or until it is parked (waiting for the window or a
    person's approval): the daemon's loop polls production meanwhile and drives it again."""

    # --- driving ----------------------------------------------------------------------------------
    async def run(self, cycle: Cycle) -> Cycle:
        steps = {DETECT: self._detect, WINDOW: self._window, DRAIN: self._drain, TUNE: self._tune,
                 CONFIRM: self._confirm, PROPOSED: self._proposed, DEPLOY: self._deploy, VERIFY: self._verify,
                 ROLLBACK: self._rollback}
        done = threading.Event()
        if self.ctx.fleet is not None and "fleet" in cycle.evidence:  # this box's tune for its fleet group
            threading.Thread(target=self._renew_lease, args=(done,), name="fleet-lease", daemon=True).start()
        try:
            while cycle.state != DONE:
                before = cycle.state
                cycle = await steps[cycle.state](cycle)
                if cycle.state == before:
                    return cycle  # parked
            return cycle
        finally:
            done.set()

    def _renew_lease(self, done: threading.Event) -> None:
        """The group's claim, renewed every third of its lease while this box tunes, confirms and deploys for
        the group. A thread of its own: a trial in virtual time holds the event loop, and a late renewal
        would hand the tune to another box."""
        fleet = self.ctx.fleet
        assert fleet is not None
        while fleet.renew(self.study):
            if done.wait(fleet.lease_s / 3):
                return
        # Another box holds the group's claim now (this box's lease ran out): its tune is the group's.
        self.lease_lost = True
        if self.tuner is not None:
            self.tuner.request_stop()

    # --- steps -------------------------------------------------------------------------------------
    async def _detect(self, cycle: Cycle) -> Cycle:
        if self._adopts(cycle):
            return self.states.transition(cycle, WINDOW, {"adopt": cycle.evidence.get("why")},
                                          scenario={"changes": {}, "drain": False}, previous_flags=self._previous())
        changes = tune_changes(self.base, cycle.trigger_kind, cycle.evidence, cycle.observed)
        try:
            scenario = apply_changes(self.base, changes)
        except (UserInputError, ValueError) as exc:
            return self.states.transition(cycle, DONE, {"reason": f"cannot tune for it: {exc}"}, outcome=SKIPPED,
                                          reason=str(exc))
        if self.stopping.is_set():
            return self._stopping(cycle)
        drain, why = drain_plan(scenario, self.config, self.target)
        spare = await asyncio.to_thread(spare_gpus, scenario, self.config.production.gpus) if drain else None
        if spare:
            # Enough idle GPUs beside production's: the tune runs there and production keeps serving.
            changes = {**changes, "engine.gpus": spare}
            scenario = apply_changes(self.base, changes)
            drain, why = drain_plan(scenario, self.config, self.target)
        if drain and not self.target.can_take_down:
            return self.states.transition(cycle, DONE, {"reason": why}, outcome=SKIPPED,
                                          reason=f"{why}: add deploy.stop and deploy.start, or give the scenario "
                                                 "engine.gpus production does not use (production.gpus)")
        return self.states.transition(cycle, WINDOW, {"changes": changes, "drain": drain, "why": why},
                                      scenario={"changes": changes, "drain": drain, "drain_why": why},
                                      previous_flags=self._previous(),
                                      warm_start=cycle.evidence.get(WARM_START) or self.states.last_study())

    def _previous(self) -> dict[str, Any] | None:
        """What a failed candidate rolls back to: the live config, unless production refused it (it OOMed and
        the emergency mitigation has not yet replaced it on disk): then its mitigation."""
        live = self.target.current()
        return None if live is None else (self.ctx.keeper.restore_flags(dict(live)) or dict(live))

    def _drains(self, cycle: Cycle) -> bool:
        return bool((cycle.scenario or {}).get("drain", True))

    async def _window(self, cycle: Cycle) -> Cycle:
        if self.stopping.is_set():
            return self._stopping(cycle)
        window = self.config.schedule_window
        if window is not None and not window.contains(self.now()):
            return cycle  # parked: the loop keeps polling production until the window opens
        return self.states.transition(cycle, DRAIN if self._drains(cycle) else TUNE)

    async def _drain(self, cycle: Cycle) -> Cycle:
        self.states.update(cycle, down_since=cycle.down_since or time.time())
        try:
            await asyncio.to_thread(self.target.stop)
        except DeployError as exc:
            return self._fail(cycle, f"could not take production down: {exc}")
        return self.states.transition(cycle, TUNE)
