"""A cycle's search: the tune, warm-started from this deployment's last study and cut to the window and to
its share of max_downtime (stopped when the daemon stops or the window closes), then confirmation and the
soak, which name the candidate: deployed at once, or proposed to a person. A fleet's adoption skips both: the
group's winner is the candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import structlog

from autotuner.daemon.cycle_context import CycleSteps
from autotuner.daemon.evidence import twin_evidence
from autotuner.daemon.state import CONFIRM, DEPLOY, PROPOSED, STOP_REASON, Cycle
from autotuner.daemon.status import certificate_figures
from autotuner.fleet.coordinator import CERTIFICATE, FLAGS, STUDY
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue

log = structlog.get_logger("autotuner.daemon")


# Of max_downtime, the share the search may use; the rest is confirmation, soak and the restart.
TUNE_SHARE = 0.5
# The soak is shortened to fit max_downtime, never below this share of what the config asks.
MIN_SOAK_SHARE = 0.25


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


class SearchSteps(CycleSteps):
    """TUNE and CONFIRM, and the time each may take."""

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


def deploy_flags(selection: Any, scenario: Scenario) -> dict[str, FlagValue]:
    """The winner as the service's `--config` file holds it: every flag the trial ran with except those
    the service's own command line sets (model, host, port, ...)."""
    from autotuner.scenario import RESERVED_FLAGS

    flags: dict[str, FlagValue] = {}
    if scenario.engine.served_model_name:
        flags["served-model-name"] = scenario.engine.served_model_name
    flags.update({k: v for k, v in selection.chosen.flags.items() if k not in RESERVED_FLAGS})
    return flags
