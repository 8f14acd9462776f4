"""A cycle's rollout: a proposal waits for a person's approval; the candidate is deployed and production
verified on it (and soaked, for a fleet's adoption); ROLLBACK puts the previous config, else a known-good one,
back up and verifies it, so that no way out of a cycle leaves production down.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import structlog

from autotuner.daemon.cycle_context import CycleSteps
from autotuner.daemon.fingerprints import box_fingerprint
from autotuner.daemon.refusals import REJECTED, START
from autotuner.daemon.refusals import VERIFY as VERIFY_REFUSAL
from autotuner.daemon.state import (
    DEPLOY,
    DEPLOYED,
    DONE,
    FAILED,
    REJECTED_OUTCOME,
    RESTORED,
    ROLLED_BACK,
    VERIFY,
    WRITTEN,
    Cycle,
)
from autotuner.daemon.status import verify_figures
from autotuner.errors import AutotunerError
from autotuner.verify import Verdict, verify
from autotuner.watch.probe import probe

log = structlog.get_logger("autotuner.daemon")


class DeploySteps(CycleSteps):
    """PROPOSED, DEPLOY, VERIFY and ROLLBACK, and the checks of production they run."""

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
