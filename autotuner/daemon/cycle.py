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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import structlog

from autotuner.daemon.config import LoadedConfig
from autotuner.daemon.state import (
    CONFIRM,
    DEPLOY,
    DEPLOYED,
    DETECT,
    DONE,
    DRAIN,
    FAILED,
    RESTORED,
    ROLLBACK,
    ROLLED_BACK,
    SKIPPED,
    TUNE,
    VERIFY,
    WINDOW,
    Cycle,
    CycleStore,
)
from autotuner.daemon.triggers import MODEL_SWAP, OBSERVED_LENGTHS, histogram_of
from autotuner.deploy import DeployError, DeployTarget
from autotuner.errors import AutotunerError, UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.verify import CONTEXT_MARGIN_TOKENS, Verdict, verify
from autotuner.vllm import FlagValue

log = structlog.get_logger("autotuner.daemon")

READY_POLL_S = 0.25


@dataclass
class Interrupt:
    """Why a tune in flight must end early: the daemon is stopping, or the window closes."""

    stopping: asyncio.Event
    window_closed: bool = False

    @property
    def reason(self) -> str:
        return "the maintenance window closed" if self.window_closed else "the daemon was asked to stop"


def flags_equal(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return (a or {}) == (b or {})


# --- the scenario a cycle tunes ----------------------------------------------------------------------

def _quantile(hist: Any, q: float) -> float | None:
    value = hist.quantile(q)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def observed_prompts(scenario: Scenario, evidence: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt lengths production served (its /metrics histogram), as the scenario's length settings:
    uniform from the median to the longest seen, cut to what the context holds."""
    hist = histogram_of(evidence.get("prompt_tokens"))
    if hist is None or hist.count < 1:
        return None
    high = _quantile(hist, 1.0) or _quantile(hist, 0.99)
    low = _quantile(hist, 0.5)
    if high is None:
        return None
    context = scenario.engine.flags.get("max-model-len")
    if isinstance(context, int):
        out = scenario.workload.requests.output_tokens
        out_max = out.value if out.kind == "fixed" else (out.max or out.high or 0)
        high = min(high, context - (out_max or 0) - CONTEXT_MARGIN_TOKENS)
    high_i = max(1, int(high))
    return {"kind": "uniform", "low": max(1, min(int(low or 1), high_i)), "high": high_i}


def tune_changes(scenario: Scenario, trigger_kind: str, evidence: dict[str, Any],
                 observed: dict[str, Any] | None = None) -> dict[str, Any]:
    """What this cycle's scenario changes in the configured one: the model production now serves (after a
    swap, and in every later cycle), the prompt lengths it saw."""
    changes: dict[str, Any] = {}
    root = evidence.get("root") if trigger_kind == MODEL_SWAP else (observed or {}).get("root")
    if root and root != scenario.engine.model:
        changes["engine.model"] = root
    if trigger_kind in OBSERVED_LENGTHS:
        prompts = observed_prompts(scenario, evidence)
        if prompts is not None:
            changes["workload.requests.prompt_tokens"] = prompts
    return changes


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

class CycleDriver:
    """Runs a cycle from whatever state it is in to DONE."""

    def __init__(self, loaded: LoadedConfig, states: CycleStore, store: Store, target: DeployTarget,
                 stopping: asyncio.Event, log_dir: Path, now: Callable[[], datetime] = datetime.now) -> None:
        self.config = loaded.config
        self.base = loaded.scenario
        self.states = states
        self.store = store
        self.target = target
        self.stopping = stopping
        self.log_dir = log_dir
        self.now = now
        self.tuner: Any = None

    # --- driving ----------------------------------------------------------------------------------
    async def run(self, cycle: Cycle) -> Cycle:
        steps = {DETECT: self._detect, WINDOW: self._window, DRAIN: self._drain, TUNE: self._tune,
                 CONFIRM: self._confirm, DEPLOY: self._deploy, VERIFY: self._verify, ROLLBACK: self._rollback}
        while cycle.state != DONE:
            cycle = await steps[cycle.state](cycle)
        return cycle

    def scenario_of(self, cycle: Cycle) -> Scenario:
        return apply_changes(self.base, (cycle.scenario or {}).get("changes", {}))

    def _fail(self, cycle: Cycle, reason: str) -> Cycle:
        log.warning("daemon.cycle_failed", cycle=cycle.id, state=cycle.state, reason=reason)
        return self.states.transition(cycle, ROLLBACK, {"reason": reason}, reason=reason)

    # --- steps -------------------------------------------------------------------------------------
    async def _detect(self, cycle: Cycle) -> Cycle:
        changes = tune_changes(self.base, cycle.trigger_kind, cycle.evidence, cycle.observed)
        try:
            apply_changes(self.base, changes)
        except (UserInputError, ValueError) as exc:
            return self.states.transition(cycle, DONE, {"reason": f"cannot tune for it: {exc}"}, outcome=SKIPPED,
                                          reason=str(exc))
        if self.stopping.is_set():
            return self.states.transition(cycle, DONE, {"reason": "the daemon was asked to stop"}, outcome=SKIPPED)
        return self.states.transition(cycle, WINDOW, {"changes": changes}, scenario={"changes": changes},
                                      previous_flags=self.target.current(), warm_start=self.states.last_study())

    async def _window(self, cycle: Cycle) -> Cycle:
        window = self.config.schedule_window
        while window is not None and not window.contains(self.now()):
            if self.stopping.is_set():
                return self.states.transition(cycle, DONE, {"reason": "the daemon was asked to stop"},
                                              outcome=SKIPPED)
            wait = (window.next_open(self.now()) - self.now()).total_seconds()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=max(0.05, min(wait, 5.0)))
        if self.stopping.is_set():
            return self.states.transition(cycle, DONE, {"reason": "the daemon was asked to stop"}, outcome=SKIPPED)
        return self.states.transition(cycle, DRAIN)

    async def _drain(self, cycle: Cycle) -> Cycle:
        down_since = cycle.down_since or time.time()
        self.states.update(cycle, down_since=down_since)
        try:
            await asyncio.to_thread(self.target.stop)
        except DeployError as exc:
            return self._fail(cycle, f"could not take production down: {exc}")
        return self.states.transition(cycle, TUNE)

    async def _tune(self, cycle: Cycle) -> Cycle:
        from autotuner.tuner.runners import runner_for
        from autotuner.tuner.study import Tuner
        from autotuner.tuner.study_setup import study_name_for

        scenario = self.scenario_of(cycle)
        runner = runner_for(scenario, self.log_dir)
        name = cycle.study_name or f"{study_name_for(scenario, runner.study_key().digest())}-c{cycle.id}"
        if cycle.study_name is None:
            self.states.update(cycle, study_name=name)
        warm = cycle.warm_start if cycle.warm_start and cycle.warm_start != name else None
        interrupt = Interrupt(self.stopping)
        tuner = Tuner(scenario, runner, self.store, study_name=name, n_trials=self.config.tune.trials,
                      timeout_s=self._tune_time(), warm_start=warm)
        self.tuner = tuner
        watcher = asyncio.ensure_future(self._watch_window(tuner, interrupt))
        try:
            summary = await tuner.run()
        except Exception as exc:  # the tuner refused or failed: production goes back up
            log.exception("daemon.tune_failed", cycle=cycle.id)
            return self._fail(cycle, f"tuning failed: {type(exc).__name__}: {exc}")
        finally:
            watcher.cancel()
            self.tuner = None
        self.states.update(cycle, trials=summary.trials_done)
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

    def _tune_time(self) -> float | None:
        budget = self.config.tune.timeout_s
        window = self.config.schedule_window
        if window is None:
            return budget
        left = window.seconds_left(self.now())
        return left if budget is None else min(budget, left)

    async def _watch_window(self, tuner: Any, interrupt: Interrupt) -> None:
        window = self.config.schedule_window
        while True:
            if self.stopping.is_set():
                tuner.request_stop()
                return
            if window is not None and not window.contains(self.now()):
                interrupt.window_closed = True
                tuner.request_stop()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=0.5)

    async def _confirm(self, cycle: Cycle) -> Cycle:
        from autotuner.analysis.selection import select
        from autotuner.export.certificate import build_certificate
        from autotuner.trust.commands import FRESH_RUNS, after_tune, parse_confirm, runner_factory
        from autotuner.tuner.runners import runner_for

        assert cycle.study_name is not None
        scenario = self.scenario_of(cycle)
        top, repeats = parse_confirm(self.config.tune.confirm)
        runner = runner_for(scenario, self.log_dir, first_run=FRESH_RUNS)
        try:
            await after_tune(scenario, self.store, cycle.study_name, runner, runner_factory(self.log_dir, FRESH_RUNS),
                             top, repeats, self.config.tune.soak_s)
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
        certificate = build_certificate(selection, [f"daemon deploy target {self.target.kind}"])
        flags = deploy_flags(selection, scenario)
        cert = {"lines": certificate.lines(), "trial": certificate.trial, "study": certificate.study,
                "peak_fraction": certificate.peak_fraction,
                "headroom_gib": [g.headroom_gib for g in certificate.memory],
                "headroom_pct": [g.headroom_pct for g in certificate.memory]}
        return self.states.transition(cycle, DEPLOY, {"trial": selection.chosen.trial_number, "flags": flags},
                                      candidate_flags=flags, candidate_trial=selection.chosen.trial_number,
                                      certificate=cert)

    async def _deploy(self, cycle: Cycle) -> Cycle:
        assert cycle.candidate_flags is not None
        try:
            if not flags_equal(self.target.current(), cycle.candidate_flags):
                await asyncio.to_thread(self.target.write, cycle.candidate_flags)
            self.states.update(cycle, down_since=cycle.down_since or time.time())
            await asyncio.to_thread(self.target.apply)
        except DeployError as exc:
            return self._fail(cycle, f"deploy failed: {exc}")
        return self.states.transition(cycle, VERIFY)

    async def _verify(self, cycle: Cycle) -> Cycle:
        verdict = await self._check_production(cycle)
        if not verdict.ok:
            return self._fail(cycle, "verify failed: " + "; ".join(verdict.problems[:3]))
        return self.states.transition(cycle, DONE, {"metrics": verdict.metrics}, outcome=DEPLOYED,
                                      **self._back_up(cycle))

    async def _rollback(self, cycle: Cycle) -> Cycle:
        """Put the previous config back up (or leave production as it was, when we never took it down)."""
        if cycle.down_since is None and cycle.candidate_flags is None:
            # Never taken down (refused before the drain): nothing to restore.
            return self.states.transition(cycle, DONE, {"reason": cycle.reason}, outcome=RESTORED)
        outcome = ROLLED_BACK if cycle.candidate_flags is not None else RESTORED
        if cycle.previous_flags is None and cycle.candidate_flags is not None and self.target.current() is not None:
            # There was no config file before this cycle: nothing to put back. Production stays up on the
            # candidate, and a person decides.
            await asyncio.to_thread(self.target.apply)
            return self.states.transition(cycle, DONE, {"reason": "no previous config file to roll back to"},
                                          outcome=FAILED, reason=f"{cycle.reason}; no previous config file to roll "
                                          "back to: production runs the candidate", **self._back_up(cycle))
        self.states.update(cycle, down_since=cycle.down_since or time.time())
        try:
            stale = cycle.previous_flags is not None and not flags_equal(self.target.current(), cycle.previous_flags)
            # The target's own `.previous` when it holds the same flags, else the flags we stored.
            if stale and not (flags_equal(self._previous_file(), cycle.previous_flags)
                              and self.target.restore_previous()):
                await asyncio.to_thread(self.target.write, cycle.previous_flags)
            await asyncio.to_thread(self.target.apply)
        except DeployError as exc:
            log.error("daemon.rollback_failed", cycle=cycle.id, reason=str(exc))
            return self.states.transition(cycle, DONE, {"reason": f"rollback failed: {exc}"}, outcome=FAILED,
                                          reason=f"{cycle.reason}; rollback failed: {exc}")
        verdict = await self._check_production(cycle)
        if not verdict.ok:
            problem = "; ".join(verdict.problems[:3])
            log.error("daemon.rollback_failed", cycle=cycle.id, reason=problem)
            return self.states.transition(cycle, DONE, {"reason": f"the previous config failed verify: {problem}"},
                                          outcome=FAILED, reason=f"{cycle.reason}; previous config: {problem}")
        return self.states.transition(cycle, DONE, {"reason": cycle.reason}, outcome=outcome, **self._back_up(cycle))

    def _previous_file(self) -> dict[str, Any] | None:
        """The flags of `<config>.previous`, the file restore_previous() puts back (file-backed targets)."""
        previous = getattr(self.target, "previous", None)
        return previous() if callable(previous) else None

    # --- production ------------------------------------------------------------------------------------
    def _back_up(self, cycle: Cycle) -> dict[str, Any]:
        """Production verified up again: the time it was down joins the cycle's downtime."""
        if cycle.down_since is None:
            return {}
        return {"down_since": None, "downtime_s": cycle.downtime_s + max(0.0, time.time() - cycle.down_since)}

    async def _check_production(self, cycle: Cycle) -> Verdict:
        scenario = self.scenario_of(cycle)
        p = self.config.production
        problem = await self.wait_ready(scenario.engine.startup_timeout_s)
        if problem is not None:
            return Verdict(False, [problem])
        try:
            return await verify(p.endpoint, None, p.api_key_env, scenario, None)
        except (AutotunerError, httpx.HTTPError, OSError) as exc:
            return Verdict(False, [f"verify could not run: {type(exc).__name__}: {exc}"])

    async def wait_ready(self, timeout_s: float) -> str | None:
        """None once production answers /health with 200 and lists its model; else why not."""
        deadline = time.monotonic() + timeout_s
        url = self.config.production.endpoint.rstrip("/")
        last = "no answer yet"
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            while time.monotonic() < deadline:
                up = await asyncio.to_thread(self.target.is_up)
                if up is False:
                    last = "the deploy target says the service is not running"
                else:
                    try:
                        r = await http.get(url + "/health")
                        if r.status_code == 200:
                            return None
                        last = f"/health answered {r.status_code}"
                    except httpx.HTTPError as exc:
                        last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(READY_POLL_S)
        return f"production not ready after {timeout_s:.0f} s: {last}"


def deploy_flags(selection: Any, scenario: Scenario) -> dict[str, FlagValue]:
    """The winner as the service's `--config` file holds it: every flag the trial ran with except those
    the service's own command line sets (model, host, port, ...)."""
    from autotuner.scenario import RESERVED_FLAGS

    flags: dict[str, FlagValue] = {}
    if scenario.engine.served_model_name:
        flags["served-model-name"] = scenario.engine.served_model_name
    flags.update({k: v for k, v in selection.chosen.flags.items() if k not in RESERVED_FLAGS})
    return flags
