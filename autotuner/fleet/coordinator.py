"""The daemon's calls into the fleet (daemon/fleet_hooks.py, daemon/cycle.py and its steps): where this box
stands in its group, whether it tunes, waits or adopts, and what it reports after a cycle. All state is in
the shared database; this object holds only the box's name, its current group and the settings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.engine import Engine

from autotuner.fleet import lease, membership, rollout
from autotuner.fleet.tables import create
from autotuner.monitor.foreign import MIB

log = structlog.get_logger("autotuner.fleet")

ADOPT_TRIGGER = "fleet-adopt"
RETUNE_TRIGGER = "fleet-retune"
# More of other processes' memory than the tuning box had, beyond this, and the winner's headroom above its
# utilization (where the unprofiled transient lands) is not what its soak proved: re-tune. Above the error
# of the daemon's estimate between two configs of one model (daemon/keeper.py: foreign_bytes).
FOREIGN_TOLERANCE_BYTES = 1024 * MIB
# Keys of a cycle's trigger evidence that carry the fleet's answer into the cycle.
ROLLOUT_ID, FLAGS, CERTIFICATE, STUDY, WARM_START = (
    "fleet_rollout", "fleet_flags", "fleet_certificate", "fleet_study", "fleet_warm_start")


@dataclass(frozen=True)
class TuneAnswer:
    tune: bool
    why: str
    study: str | None = None  # a study to resume: the claim was taken over from a box that stopped renewing
    warm_start: str | None = None  # a related group's study (other GPUs)


@dataclass(frozen=True)
class Retune:
    """The group's winner is not for this box: it has less memory free than the box that tuned it."""

    winner: rollout.Rollout
    why: str

    def evidence(self) -> dict[str, Any]:
        return {WARM_START: self.winner.study_name, ROLLOUT_ID: self.winner.id, "why": self.why}


class Fleet:
    def __init__(self, engine: Engine, box: str, deployment: str, *, lease_s: float, healthy_s: float,
                 hold_s: float, soak_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.box = box
        self.deployment = deployment
        self.lease_s = lease_s
        self.healthy_s = healthy_s
        self.hold_s = hold_s
        self.soak_s = soak_s
        self.clock = clock
        self.group = ""
        self.family = ""
        self.describe: dict[str, Any] = {}
        self.waiting: str | None = None  # why this box last waited, for /status
        create(engine)

    def place(self, group: str, family: str, describe: dict[str, Any]) -> None:
        """This box's group as of this poll (a GPU or engine change moves it to another one)."""
        self.group, self.family, self.describe = group, family, describe

    def heartbeat(self, live_flags: dict[str, Any] | None, certificate: dict[str, Any] | None, healthy: bool) -> None:
        membership.heartbeat(self.engine, membership.Member(
            self.box, self.group, self.family, self.deployment, self.describe, live_flags, certificate, healthy,
            self.clock()))

    # --- tuning for the group ------------------------------------------------------------------------
    def ask_to_tune(self) -> TuneAnswer:
        got = lease.claim(self.engine, self.group, self.family, self.box, self.lease_s, self.clock())
        if got is None:
            held = lease.current(self.engine, self.group)
            holder = held.holder if held is not None else "another box"
            state = held.state if held is not None else "tuning"
            why = (f"{holder} tunes for the group" if state == lease.TUNING
                   else f"{holder} tuned for the group; its winner rolls out")
            return TuneAnswer(False, why)
        warm = membership.family_study(self.engine, self.family, self.group)
        if got.taken_over_from is not None:
            log.warning("fleet.tune_taken_over", group=self.group, box=self.box, previous=got.taken_over_from,
                        study=got.study_name)
            return TuneAnswer(True, f"took the group's tune over from {got.taken_over_from} (its lease ran out)",
                              study=got.study_name, warm_start=warm)
        return TuneAnswer(True, "this box tunes for the group", study=got.study_name, warm_start=warm)

    def renew(self, study: str | None = None) -> bool:
        kept = lease.renew(self.engine, self.group, self.box, self.lease_s, self.clock(), study)
        if not kept:
            log.warning("fleet.lease_lost", group=self.group, box=self.box)
        return kept

    def tune_ended(self, ok: bool, reason: str | None, flags: dict[str, Any] | None = None,
                   certificate: dict[str, Any] | None = None, study: str | None = None,
                   trial: int | None = None, foreign_bytes: int | None = None) -> None:
        now = self.clock()
        held = lease.current(self.engine, self.group)
        if held is None or held.holder != self.box:
            log.warning("fleet.tune_not_published", group=self.group, box=self.box, reason="the claim is another box's")
            return
        if ok and flags is not None:
            rid = rollout.publish(self.engine, self.group, self.box, flags, certificate, study, trial, now,
                                  foreign_bytes)
            log.info("fleet.published", group=self.group, box=self.box, rollout=rid, study=study, trial=trial)
        lease.finish(self.engine, self.group, self.box, ok, self.hold_s, now, reason)

    # --- adopting the group's winner -----------------------------------------------------------------
    def pending(self, foreign_bytes: int | None = None) -> rollout.Step | Retune | None:
        """The group's winner, when it is this box's turn to adopt it; a Retune when this box has more of
        other processes' memory than the box that tuned it (`foreign_bytes`: the most on one of its GPUs)."""
        r = rollout.latest(self.engine, self.group)
        if r is not None and r.foreign_bytes is not None and foreign_bytes is None and r.tuned_by != self.box:
            # Not blindly: this box's GPU memory could not be read this poll, the tuning box's was.
            self.waiting = "this box's GPU memory could not be read to compare with the tuning box's"
            return None
        misfit = self._misfit(r, foreign_bytes)
        if misfit is not None:
            return misfit
        step = rollout.next_step(self.engine, self.group, self.box, self.healthy_s,
                                 stale_s=max(3 * self.lease_s, 60.0), now=self.clock())
        self.waiting = None if step is None or step.adopt else step.why
        return step if step is not None and step.adopt else None

    def _misfit(self, r: rollout.Rollout | None, foreign_bytes: int | None) -> Retune | None:
        if r is None or r.state not in rollout.IN_FLIGHT or r.foreign_bytes is None or foreign_bytes is None:
            return None
        extra = foreign_bytes - r.foreign_bytes
        if extra <= FOREIGN_TOLERANCE_BYTES or rollout.adoption(self.engine, r.id, self.box) is not None:
            return None
        why = (f"other processes hold {foreign_bytes / MIB:.0f} MiB on this box's GPUs, {extra / MIB:.0f} MiB more "
               f"than on {r.tuned_by}, which tuned the winner: its headroom was not soaked here, so this box "
               "tunes for itself, warm-started from the group's study")
        if not rollout.decline(self.engine, r.id, self.box, why, self.clock()):
            return None
        log.info("fleet.retune", group=self.group, box=self.box, rollout=r.id, why=why)
        return Retune(r, why)

    def adoption_evidence(self, step: rollout.Step) -> dict[str, Any]:
        r = step.rollout
        return {ROLLOUT_ID: r.id, FLAGS: r.flags, CERTIFICATE: r.certificate, "canary": step.canary,
                "tuned_by": r.tuned_by, "study": r.study_name, "trial": r.trial, "why": step.why}

    def adoption_started(self, rollout_id: int) -> bool:
        return rollout.start(self.engine, rollout_id, self.box, self.clock())

    def adoption_ended(self, rollout_id: int, ok: bool, reason: str | None) -> None:
        rollout.finish(self.engine, rollout_id, self.box, ok, reason, self.clock())
        log.info("fleet.adoption", group=self.group, box=self.box, rollout=rollout_id, ok=ok, reason=reason)
