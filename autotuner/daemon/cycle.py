"""One cycle, step by step, each step persisted before it runs (state.py): take production down (the
scenario's GPUs are production's), tune warm-started from this deployment's last study, confirm and soak,
deploy the winner, verify production with the scenario's long prompts; roll back when any of it fails.
Production is never left down: every way out of a cycle that took it down goes through ROLLBACK, which puts
the previous config back up and verifies it.

A step that was in flight when the daemon was killed is run again on restart; each one is written so that
running it twice is the same as running it once (the target's file is written atomically and compared
before it is written again, the tuner resumes its study).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import structlog

from autotuner.daemon.config import LoadedConfig
from autotuner.daemon.drain import drain_plan, spare_gpus
from autotuner.daemon.evidence import tune_changes, twin_evidence
from autotuner.daemon.fingerprints import box_fingerprint, refusal_fingerprint
from autotuner.daemon.keeper import Keeper
from autotuner.daemon.known_good import KnownGoodChain
from autotuner.daemon.refusals import REJECTED, START, Refusals
from autotuner.daemon.refusals import VERIFY as VERIFY_REFUSAL
from autotuner.daemon.runtime import RuntimeStore
from autotuner.daemon.state import (
    CONFIRM,
    DEPLOY,
    DEPLOYED,
    DETECT,
    DONE,
    DRAIN,
    FAILED,
    PROPOSED,
    REJECTED_OUTCOME,
    RESTORED,
    ROLLBACK,
    ROLLED_BACK,
    SKIPPED,
    STOP_REASON,
    TUNE,
    VERIFY,
    WINDOW,
    WRITTEN,
    Cycle,
    CycleStore,
)
from autotuner.daemon.status import certificate_figures, verify_figures
from autotuner.deploy import DeployError, DeployTarget
from autotuner.errors import AutotunerError, UserInputError
from autotuner.fleet.coordinator import ADOPT_TRIGGER, CERTIFICATE, FLAGS, STUDY, WARM_START, Fleet
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.verify import Verdict, verify
from autotuner.vllm import FlagValue
from autotuner.watch.probe import probe

log = structlog.get_logger("autotuner.daemon")



@dataclass
class Interrupt:
    """Why a tune in flight must end early: the daemon is stopping, or the window closes."""

    stopping: asyncio.Event
    window_closed: bool = False

    @property
    def reason(self) -> str:
        return "the maintenance window closed" if self.window_closed else STOP_REASON


def flags_equal(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return (a or {}) == (b or {})


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


# --- the cycle ---------------------------------------------------------------------------------------

# Of max_downtime, the share the search may use; the rest is confirmation, soak and the restart.
TUNE_SHARE = 0.5
# The soak is shortened to fit max_downtime, never below this share of what the config asks.
MIN_SOAK_SHARE = 0.25


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


class CycleDriver:
    """Runs a cycle from whatever state it is in to DONE, or until it is parked (waiting for the window or a
    person's approval): the daemon's loop polls production meanwhile and drives it again."""

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

    # --- steps -------------------------------------------------------------------------------------
    def _adopts(self, cycle: Cycle) -> bool:
        """The group's winner, tuned on an identical box: deployed and verified here, never re-tuned."""
        return cycle.trigger_kind == ADOPT_TRIGGER

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

    def _downtime_left(self, cycle: Cycle) -> float | None:
        """Seconds of max_downtime left to this cycle (None: no bound, or production was never taken down)."""
        bound = self.config.max_downtime_s
        if bound is None or cycle.down_since is None:
            return None
        return bound - (time.time() - cycle.down_since)

    async def _tune(self, cycle: Cycle) -> Cycle:
        from autotuner.tuner.runners import runner_for
        from autotuner.tuner.study import Tuner
        from autotuner.tuner.study_setup import study_name_for

        if self._adopts(cycle):
            return self.states.transition(cycle, CONFIRM, {"adopt": "no tune: the group's winner"})
        scenario = self.scenario_of(cycle)
        runner = runner_for(scenario, self.log_dir)
        # A tune taken over from a fleet box that stopped renewing its claim resumes that box's study.
        name = cycle.study_name or cycle.evidence.get(STUDY) or \
            f"{study_name_for(scenario, runner.study_key().digest())}-c{cycle.id}"
        if cycle.study_name is None:
            self.states.update(cycle, study_name=name,
                               scenario={**(cycle.scenario or {}), "tune_started_at": time.time()})
        warm = cycle.warm_start if cycle.warm_start and cycle.warm_start != name else None
        interrupt = Interrupt(self.stopping)
        tuner = Tuner(scenario, runner, self.store, study_name=name, n_trials=self.config.tune.trials,
                      timeout_s=self._tune_time(cycle), warm_start=warm, twin=self.config.tune.twin,
                      twin_evidence=twin_evidence(scenario, cycle.evidence))
        self.tuner = tuner
        watcher = asyncio.ensure_future(self._watch_window(tuner, interrupt))
        self.study = name
        try:
            summary = await tuner.run()
        except Exception as exc:  # the tuner refused or failed: production goes back up
            log.exception("daemon.tune_failed", cycle=cycle.id)
            return self._fail(cycle, f"tuning failed: {type(exc).__name__}: {exc}")
        finally:
            watcher.cancel()
            self.tuner = None
        self.states.update(cycle, trials=summary.trials_done)
        if self.lease_lost:
            return self._fail(cycle, "another box of the fleet took the group's tune over")
        if summary.interrupted or self._window_closed():
            interrupt.window_closed = interrupt.window_closed or self._window_closed()
            return self._fail(cycle, f"tuning interrupted: {interrupt.reason}")
        if summary.stopped_reason is not None:
            return self._fail(cycle, f"tuning stopped: {summary.stopped_reason}")
        if not summary.best:
            return self._fail(cycle, "tuning found no feasible configuration")
        return self.states.transition(cycle, CONFIRM, {"study": name, "trials": summary.trials_done,
                                                        "ended": summary.ended}, trials=summary.trials_done)

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

    def _window_closed(self) -> bool:
        window = self.config.schedule_window
        return window is not None and not window.contains(self.now())

    def _tune_time(self, cycle: Cycle) -> float | None:
        """The search's time: the tune timeout, cut to the window and to its share of max_downtime."""
        limits = [self.config.tune.timeout_s]
        window = self.config.schedule_window
        if window is not None:
            limits.append(window.seconds_left(self.now()))
        left = self._downtime_left(cycle)
        if left is not None and self.config.max_downtime_s is not None:
            limits.append(max(1.0, self.config.max_downtime_s * TUNE_SHARE - (self.config.max_downtime_s - left)))
        given = [x for x in limits if x is not None]
        return min(given) if given else None

    async def _watch_window(self, tuner: Any, interrupt: Interrupt) -> None:
        while True:
            window = self.config.schedule_window  # read each time: a SIGHUP may change it mid-tune
            if self.stopping.is_set():
                tuner.request_stop()
                return
            if window is not None and not window.contains(self.now()):
                interrupt.window_closed = True
                tuner.request_stop()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=0.5)

    def _soak_time(self, cycle: Cycle, top: int, repeats: int, replays: int = 1) -> float | None:
        """The soak, shortened to fit what is left of max_downtime after confirmation and a restart (the
        engine runs are estimated from the search's own pace); None when even a short soak does not fit."""
        soak = self.config.tune.soak_s
        left = self._downtime_left(cycle)
        if left is None:
            return soak
        started = (cycle.scenario or {}).get("tune_started_at") or cycle.down_since or time.time()
        per_run = (time.time() - started) / max(1, cycle.trials or 1)
        restart = min(self.base.engine.startup_timeout_s, per_run)
        # The first round's replays each as long as a whole run at most (no restart, the same workload).
        room = left - top * (repeats + replays - 1) * per_run - restart
        if room >= soak:
            return soak
        if room < soak * MIN_SOAK_SHARE:
            return None
        return room

    async def _confirm(self, cycle: Cycle) -> Cycle:
        from autotuner.analysis.selection import select
        from autotuner.export.certificate import build_certificate
        from autotuner.trust.commands import FRESH_RUNS, after_tune, parse_confirm, runner_factory
        from autotuner.tuner.runners import runner_for

        if self._adopts(cycle):
            return self._adopt(cycle)
        assert cycle.study_name is not None
        scenario = self.scenario_of(cycle)
        plan = parse_confirm(self.config.tune.confirm)
        soak_s = self._soak_time(cycle, *plan)
        if soak_s is None:
            return self._fail(cycle, f"max_downtime {self.config.max_downtime} leaves no time to confirm and soak: "
                              "production goes back on its previous config (raise max_downtime, or lower "
                              "tune.trials)")
        if soak_s < self.config.tune.soak_s:
            self.states.note("planned", {"soak_s": round(soak_s, 1), "asked_soak_s": self.config.tune.soak_s,
                                         "why": f"to stay within max_downtime {self.config.max_downtime}"}, cycle.id)
        runner = runner_for(scenario, self.log_dir, first_run=FRESH_RUNS)
        try:
            await after_tune(scenario, self.store, cycle.study_name, runner, runner_factory(self.log_dir, FRESH_RUNS),
                             plan, soak_s)
            selection = select(self.store.url, cycle.study_name, [], self.config.tune.policy)
        except Exception as exc:
            log.exception("daemon.confirm_failed", cycle=cycle.id)
            return self._fail(cycle, f"confirm/soak failed: {type(exc).__name__}: {exc}")
        if self.stopping.is_set():
            return self._fail(cycle, "the daemon was asked to stop before the rollout")
        if self._window_closed():
            return self._fail(cycle, "the maintenance window closed before the rollout")
        if selection.missing:
            return self._fail(cycle, f"trial {selection.chosen.trial_number} is not verified: "
                              + "; ".join(selection.missing))
        flags = deploy_flags(selection, scenario)
        refused = self.ctx.refusals.refused(self.fingerprints(cycle), flags)
        if refused is not None:
            return self._fail(cycle, f"the winner was refused by production before ({refused.kind}, {refused.count}×: "
                              f"{refused.reason[:200]}); not deployed again")
        if flags_equal(flags, cycle.previous_flags):
            return self._fail(cycle, "the winner is the config production already runs: nothing to deploy")
        certificate = build_certificate(selection, [f"daemon deploy target {self.target.kind}"])
        cert = {"lines": certificate.lines(), "trial": certificate.trial, "study": certificate.study,
                "peak_fraction": certificate.peak_fraction,
                "headroom_gib": [g.headroom_gib for g in certificate.memory],
                "headroom_pct": [g.headroom_pct for g in certificate.memory],
                # What verify is compared with (daemon/status.py), in the certificate's units.
                **certificate_figures(certificate, selection)}
        manual = self.config.approve == "manual" or not self.target.can_take_down
        return self.states.transition(cycle, PROPOSED if manual else DEPLOY,
                                      {"trial": selection.chosen.trial_number, "flags": flags},
                                      candidate_flags=flags, candidate_trial=selection.chosen.trial_number,
                                      certificate=cert)

    def _adopt(self, cycle: Cycle) -> Cycle:
        """The group's confirmed, soaked winner as this box's candidate: deployed, then verified here."""
        flags = dict(cycle.evidence.get(FLAGS) or {})
        refused = self.ctx.refusals.refused(self.fingerprints(cycle), flags)
        if refused is not None:
            return self._fail(cycle, f"the group's winner was refused by this box before ({refused.kind}): "
                              f"{refused.reason[:200]}")
        manual = self.config.approve == "manual" or not self.target.can_take_down
        return self.states.transition(cycle, PROPOSED if manual else DEPLOY, {"adopt": flags},
                                      candidate_flags=flags, candidate_trial=cycle.evidence.get("trial"),
                                      certificate=cycle.evidence.get(CERTIFICATE))

    async def _proposed(self, cycle: Cycle) -> Cycle:
        """Waiting for a person: production serves meanwhile (back on its previous config if the tune took it
        down); `autotuner daemon approve` or `reject` decides."""
        if cycle.down_since is not None:
            result = await self.ctx.keeper.bring_up("the cycle waits for approval", first=cycle.previous_flags,
                                                    cycle_id=cycle.id)
            self.states.update(cycle, down_since=None)
            if not result.ok:
                return self.states.transition(cycle, DONE, {"reason": result.reason}, outcome=FAILED,
                                              reason=f"production did not come back while waiting: {result.reason}")
            self.ctx.notify("proposed", f"cycle {cycle.id} proposes trial {cycle.candidate_trial}: approve with "
                            f"`autotuner daemon approve CONFIG {cycle.id}`", self._proposal(cycle))
        elif not self.states.events(kind="proposed", cycle_id=cycle.id, limit=1):
            self.states.note("proposed", {"flags": cycle.candidate_flags, "trial": cycle.candidate_trial}, cycle.id)
            self.ctx.notify("proposed", f"cycle {cycle.id} proposes trial {cycle.candidate_trial}: approve with "
                            f"`autotuner daemon approve CONFIG {cycle.id}`", self._proposal(cycle))
        decision = self.states.decision(cycle.id)
        if decision is None:
            return cycle  # parked
        verdict, who = decision
        if verdict == "reject":
            self.ctx.refusals.record(self.fingerprint(cycle), cycle.candidate_flags or {}, REJECTED,
                                     f"rejected by {who}", cycle.id)
            return self.states.transition(cycle, DONE, {"reason": f"rejected by {who}"}, outcome=REJECTED_OUTCOME,
                                          reason=f"rejected by {who}")
        if not self.target.can_take_down:
            # Approved, and the target only writes: the file is the deployment, a person restarts the service.
            deployment = self._deployment(cycle)
            await asyncio.to_thread(lambda: self.target.write(cycle.candidate_flags or {}, deployment=deployment))
            self.ctx.runtime.set(live_flags=cycle.candidate_flags)
            return self.states.transition(cycle, DONE, {"reason": "written; restart production to run it"},
                                          outcome=WRITTEN, reason="written to the config file; production runs it "
                                          "after its next restart")
        return self.states.transition(cycle, DEPLOY, {"approved_by": who})

    async def _deploy(self, cycle: Cycle) -> Cycle:
        assert cycle.candidate_flags is not None
        self.states.update(cycle, down_since=cycle.down_since or time.time())
        problem = await self.ctx.keeper.start_on(dict(cycle.candidate_flags), self._deployment(cycle))
        if problem is not None:
            # A failed start is the box's answer, whatever workload the next cycle tunes for.
            self.ctx.refusals.record(box_fingerprint(cycle.observed), cycle.candidate_flags, START, problem, cycle.id)
            return self._fail(cycle, f"deploy failed: {problem}")
        return self.states.transition(cycle, VERIFY)

    async def _verify(self, cycle: Cycle) -> Cycle:
        started = time.time()
        verdict = await self._check_production(cycle)
        if verdict.ok and self._adopts(cycle) and self.ctx.fleet is not None:
            verdict = await self._soak_production(cycle, self.ctx.fleet.soak_s)
        self.ctx.own_traffic(started, time.time())
        if not verdict.ok:
            reason = "verify failed: " + "; ".join(verdict.problems[:3])
            self.ctx.refusals.record(self.fingerprint(cycle), cycle.candidate_flags or {}, VERIFY_REFUSAL, reason,
                                     cycle.id)
            return self._fail(cycle, reason)
        flags = dict(cycle.candidate_flags or {})
        self.ctx.chain.record(flags, box_fingerprint(cycle.observed), "deployed", cycle.certificate, cycle.id)
        self.ctx.runtime.set(live_flags=flags, alarm=None)
        speedup = await self._production_speedup()
        cycle = self.states.transition(cycle, DONE, {"metrics": verdict.metrics, "production_speedup": speedup},
                                       outcome=DEPLOYED, down_since=None)
        verified = verify_figures(cycle.certificate, verdict.metrics, speedup)
        self.ctx.notify("cycle-end", f"cycle {cycle.id} deployed trial {cycle.candidate_trial} "
                        f"(trigger {cycle.trigger_kind})",
                        {"flags": flags, "comparison": (cycle.certificate or {}).get("comparison"),
                         "verify": verified and f"verified in production: {verified['summary']}"})
        return cycle

    async def _soak_production(self, cycle: Cycle, soak_s: float) -> Verdict:
        """A winner tuned on another box: this box's production verified again and again for the fleet's
        short soak, on its own hardware; the first failure ends it."""
        verdict, end = Verdict(True, []), time.monotonic() + soak_s
        while verdict.ok and time.monotonic() < end and not self.stopping.is_set():
            verdict = await self._check_production(cycle)
        return verdict

    async def _rollback(self, cycle: Cycle) -> Cycle:
        """Production back up on the previous config, else on the last-known-good chain; else the alarm."""
        if cycle.down_since is None and not self._candidate_went_live(cycle):
            # Never taken down, and the candidate never replaced the live config: production kept serving.
            cycle = self.states.transition(cycle, DONE, {"reason": cycle.reason}, outcome=RESTORED)
            self.ctx.notify("cycle-end", f"cycle {cycle.id} ended without a deploy: {cycle.reason}", {})
            return cycle
        if cycle.previous_flags is None and cycle.candidate_flags is not None and self.target.current() is not None:
            # There was no config file before this cycle: nothing to put back. Production stays up on the
            # candidate, and a person decides.
            await self.ctx.keeper.start_on(dict(cycle.candidate_flags))
            return self.states.transition(cycle, DONE, {"reason": "no previous config file to roll back to"},
                                          outcome=FAILED, reason=f"{cycle.reason}; no previous config file to roll "
                                          "back to: production runs the candidate", down_since=None)
        self.states.update(cycle, down_since=cycle.down_since or time.time())
        exclude = [cycle.candidate_flags] if cycle.candidate_flags is not None else []
        result = await self.ctx.keeper.bring_up(f"cycle {cycle.id}: {cycle.reason}", first=cycle.previous_flags,
                                                exclude=exclude, cycle_id=cycle.id)
        if not result.ok:
            log.error("daemon.rollback_failed", cycle=cycle.id, reason=result.reason)
            cycle = self.states.transition(cycle, DONE, {"reason": f"rollback failed: {result.reason}"},
                                           outcome=FAILED, reason=f"{cycle.reason}; production could not be brought "
                                           f"back: {result.reason}")
            self.ctx.notify("rollback", f"cycle {cycle.id}: rollback FAILED, production is down: {result.reason}", {})
            return cycle
        outcome = ROLLED_BACK if cycle.candidate_flags is not None and self._candidate_went_live(cycle) else RESTORED
        how = "" if result.source == "asked" and not result.fitted else \
            f" (on {'a known-good config' if result.source == 'chain' else 'the previous config'}" + \
            (f"; {result.fitted}" if result.fitted else "") + ")"
        cycle = self.states.transition(cycle, DONE, {"reason": cycle.reason, "restored": result.flags,
                                                     "fitted": result.fitted, "source": result.source},
                                       outcome=outcome, reason=f"{cycle.reason}{how}", down_since=None)
        self.ctx.notify("rollback", f"cycle {cycle.id} {outcome}: {cycle.reason}", {"restored": result.flags})
        return cycle

    def _proposal(self, cycle: Cycle) -> dict[str, Any]:
        """What a person deciding on a proposal reads: the flags and how they compare with what runs."""
        return {"flags": cycle.candidate_flags, "comparison": (cycle.certificate or {}).get("comparison")}

    async def _production_speedup(self) -> float | None:
        """A simulated production's speed-up (its /version says), which puts verify's wall-clock figures
        in the certificate's units; None for a real vLLM or when it cannot be read."""
        try:
            snap = await probe(self.config.production.endpoint, api_key_env=self.config.production.api_key_env)
        except Exception:  # a figure's units are not worth failing a verified deploy over
            return None
        speedup = (snap.simulator or {}).get("speedup")
        return float(speedup) if isinstance(speedup, int | float) else None

    def _deployment(self, cycle: Cycle) -> Any:
        """The exporter's deployment of the cycle's winner, so that the file the daemon writes carries the
        certificate and the full run hint (environment variables included), as `export --format yaml`
        does; None (a bare header) when the study cannot be read back."""
        from autotuner.analysis.selection import select
        from autotuner.export.certificate import build_certificate
        from autotuner.export.formats import deployment

        try:
            selection = select(self.store.url, cycle.study_name, [], self.config.tune.policy)
            return deployment(selection, build_certificate(selection, [f"daemon deploy target {self.target.kind}"]))
        except Exception as exc:  # the header is documentation: never a reason not to deploy
            log.warning("daemon.no_certificate_header", cycle=cycle.id, error=f"{type(exc).__name__}: {exc}")
            return None

    def _candidate_went_live(self, cycle: Cycle) -> bool:
        return any(e.to_state == VERIFY or (e.from_state == DEPLOY)
                   for e in self.states.events(kind="transition", cycle_id=cycle.id, limit=50))

    async def _check_production(self, cycle: Cycle) -> Verdict:
        scenario = self.scenario_of(cycle)
        p = self.config.production
        problem = await self.ctx.keeper.ready(scenario.engine.startup_timeout_s)
        if problem is not None:
            return Verdict(False, [problem])
        try:
            return await verify(p.endpoint, None, p.api_key_env, scenario, None)
        except (AutotunerError, httpx.HTTPError, OSError) as exc:
            return Verdict(False, [f"verify could not run: {type(exc).__name__}: {exc}"])


def deploy_flags(selection: Any, scenario: Scenario) -> dict[str, FlagValue]:
    """The winner as the service's `--config` file holds it: every flag the trial ran with except those
    the service's own command line sets (model, host, port, ...)."""
    from autotuner.scenario import RESERVED_FLAGS

    flags: dict[str, FlagValue] = {}
    if scenario.engine.served_model_name:
        flags["served-model-name"] = scenario.engine.served_model_name
    flags.update({k: v for k, v in selection.chosen.flags.items() if k not in RESERVED_FLAGS})
    return flags
