"""The study loop: ask a candidate, screen it, run it through the TrialRunner, tell Optuna the
objectives and the constraints, write everything to the database before the next trial.

A plain object (`Tuner`) that a CLI command and the daemon run, stop and resume. Killing it at any
moment loses at most the trial in flight: on the next run a stale RUNNING trial is failed and its
parameters queued again (recovery.py), and the study continues to its study-wide budget. This module
only loops; each step is its own module: the study lock (study_lock.py), opening the study
(study_setup.py), seed trials (seeding.py), GPU groups (groups.py), screening and repair
(screening.py), the heartbeat (heartbeat.py), the infrastructure retry (infra_retry.py), tell and
writes (recording.py), the budget (budget.py) and the summary (tune_summary.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna
import structlog

from autotuner.durations import parse_duration
from autotuner.engine.gpu_locks import GpusBusyError
from autotuner.scenario import Scenario
from autotuner.secrets import display_url
from autotuner.store.db import Store
from autotuner.trials.outcomes import TrialKind
from autotuner.trials.result import TrialResult
from autotuner.tuner import pruning
from autotuner.tuner.breaker import CircuitBreaker
from autotuner.tuner.budget import Budget, launched_trials
from autotuner.tuner.gpu_guard import gpu_headroom, hold_gpus
from autotuner.tuner.groups import AUTO, GpuGroup, GroupSlots, plan_groups, record_neighbours
from autotuner.tuner.heartbeat import heartbeat
from autotuner.tuner.infra_retry import measure_with_retry
from autotuner.tuner.listeners import listen_as
from autotuner.tuner.memory_model import MemoryModel
from autotuner.tuner.memory_warm_start import warm_started
from autotuner.tuner.recording import TrialRecorder
from autotuner.tuner.recovery import recover
from autotuner.tuner.runners import TrialRunner, VirtualRunner
from autotuner.tuner.screening import Screening
from autotuner.tuner.seeding import seed_trials
from autotuner.tuner.space import FlagRules, build_space, fit_utilization_to_free
from autotuner.tuner.study_lock import StudyLock
from autotuner.tuner.study_setup import open_study, study_name_for
from autotuner.tuner.tune_summary import TuneSummary, group_labels, summarize
from autotuner.twin.calibrate import Observation
from autotuner.twin.guide import TwinGuide
from autotuner.twin.params import PRIOR
from autotuner.twin.production import STUDY_ATTR
from autotuner.twin.warm import warm_prior

log = structlog.get_logger(__name__)

Event = Callable[[str, dict[str, Any]], None]


class Tuner:
    def __init__(self, scenario: Scenario, runner: TrialRunner, store: Store, *, study_name: str | None = None,
                 n_trials: int | None = None, timeout_s: float | None = None, seed: int = 0,
                 on_event: Event | None = None, warm_start: str | None = None, prune: bool = True,
                 gpu_groups: str | int = AUTO, twin: bool = False, twin_evidence: Sequence[Observation] = ()) -> None:
        self.scenario = scenario
        self.runner = runner
        self.store = store
        self.space = build_space(scenario)
        self.key = runner.study_key()
        self.study_name = study_name or study_name_for(scenario, self.key.digest())
        self.n_trials = n_trials or scenario.budget.trials
        self.timeout_s = timeout_s if timeout_s is not None else parse_duration(scenario.budget.timeout)
        self.seed = seed
        self.warm_start = warm_start
        self.prune = prune  # stop hopeless trials during their workload (pruning.py)
        self.on_event = on_event or (lambda _k, _d: None)
        self.rules = FlagRules(scenario, self.key.gpu_inventory, self.key.engine_version)
        self.breaker = CircuitBreaker()
        self.recorder = TrialRecorder(scenario, store, self.study_name, self.on_event)
        self._stop = asyncio.Event()
        self._signalled = False
        self._measuring: set[asyncio.Future[TrialResult]] = set()
        self.gpu_groups = gpu_groups
        self.use_twin = twin  # twin-first search where the study has a twin (autotuner.twin)
        # What the box showed outside this study (production's served window, in the daemon): the twin's
        # calibration starts with it. Stored with the study when it is created, so a resume sees the same.
        self.twin_evidence = list(twin_evidence)
        self.groups: list[GpuGroup] = []
        self._study_lock = asyncio.Lock()  # one ask or tell at a time (the sampler sees every RUNNING trial)

    # --- control -------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """SIGINT/SIGTERM: stop the engines of the trials in flight and end the run."""
        self._signalled = True
        self._stop_all()

    def _stop_all(self) -> None:
        self._stop.set()
        for task in list(self._measuring):
            task.cancel()

    # --- the loop ------------------------------------------------------------------------------------
    async def run(self) -> TuneSummary:
        with StudyLock(self.store), hold_gpus(self.scenario):
            return await self._run()

    async def _run(self) -> TuneSummary:
        # Other processes' memory on the GPUs caps the utilization that can start (GpusBusyError if
        # another autotuner holds them).
        self.space = fit_utilization_to_free(self.space, gpu_headroom(self.scenario))
        self.groups = plan_groups(self.scenario, self.gpu_groups)
        study, sampler = self._open_study()
        requeued = recover(study, self._opened.storage, self.store, self.study_name)
        if self.use_twin and self.twin_evidence and STUDY_ATTR not in study.user_attrs:
            study.set_user_attr(STUDY_ATTR, [o.as_dict() for o in self.twin_evidence])
        self.guide = self._twin()
        # With a twin, a warm start is the box's calibration (the twin's prior), not the old model's configs:
        # its first finalist is already predicted for the new model on this box.
        seed_trials(study, scenario=self.scenario, space=self.space, rules=self.rules, store=self.store,
                    study_name=self.study_name, created=self._opened.created, warm_start=self.warm_start,
                    storage=self._opened.storage, warm_configs=not self.guide.active)
        labels = group_labels(self.groups)
        log.info("tune.started", study=self.study_name, sampler=sampler, trials=self.n_trials,
                 requeued=requeued, storage=display_url(self.store.url), gpu_groups=labels)
        self.on_event("started", {"study": self.study_name, "sampler": sampler, "budget": self.n_trials,
                                  "requeued": requeued, "gpu_groups": labels})
        self.memory = self._learn_wall()
        self.screening = Screening(self.scenario, self.rules, self.space, self.memory)
        ended = await self._schedule(study)
        if self._signalled or self._stop.is_set():
            ended = "interrupted"
        return self._summary(study, sampler, ended)

    def _open_study(self) -> tuple[optuna.Study, str]:
        """The study (created or continued: same setup, same directions) and its sampler, described."""
        self._opened = open_study(self.scenario, self.store, self.study_name, self.key, seed=self.seed,
                                  n_trials=self.n_trials)
        return self._opened.study, self._opened.sampler

    def _summary(self, study: optuna.Study, sampler: str, ended: str) -> TuneSummary:
        return summarize(study, self.space, study_name=self.study_name, n_trials=self.n_trials, sampler=sampler,
                         ended=ended, stopped_reason=self.breaker.tripped, groups=self.groups,
                         twin=self.guide.describe())

    def _twin(self) -> TwinGuide:
        """The study's twin, its prior the box calibration of the warm start's study when there is one."""
        prior = warm_prior(self.store, self.warm_start, VirtualRunner) if self.warm_start and self.use_twin else PRIOR
        return TwinGuide.for_study(self.scenario, self.space, self.store, self.study_name, self.key.gpu_inventory,
                                   VirtualRunner, enabled=self.use_twin, prior=prior)

    def _learn_wall(self) -> MemoryModel:
        # The memory model learns from every measured trial so far (a resumed study starts where it was).
        memory = MemoryModel.for_scenario(self.scenario, self.rules.defaults(), self.store.trials(self.study_name))
        if self.warm_start:  # after a model swap: the old study's wall, rescaled, as the prior
            memory = warm_started(memory, self.store, self.warm_start, self.scenario)
        return memory

    async def _schedule(self, study: optuna.Study) -> str:
        """Start a trial on each free GPU group while the budget allows, until the budget, the time or
        the space runs out; with one group this is one trial after the other."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        budget = Budget(self.study_name, self.n_trials, deadline, self.breaker)
        slots = GroupSlots(self.groups)
        running: dict[asyncio.Future[tuple[bool, bool]], GpuGroup] = {}
        ended = "budget"
        error: BaseException | None = None
        while True:
            while slots.free() and not self._stop.is_set():
                done = len(launched_trials(study))
                why = budget.why_end(done + len(running)) or await self._twin_next(study)
                if why is not None:
                    ended = why
                    break
                group = slots.take()
                running[asyncio.ensure_future(self._one(study, done, group, slots, len(running)))] = group
            if not running:
                break
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                slots.give_back(running.pop(task))
                if task.exception() is not None:
                    # Bad input or busy GPUs: stop the other trials (recorded, queued again) and say why.
                    error = error or task.exception()
                    self._stop_all()
                    continue
                interrupted, launched = task.result()
                if interrupted:
                    self._stop_all()
                budget.ended(launched)
        if error is not None:
            raise error
        return ended

    async def _twin_next(self, study: optuna.Study) -> str | None:
        """The twin queues its next finalist (a few seconds of CPU, off the event loop), or ends the search."""
        if not self.guide.active:
            return None
        async with self._study_lock:
            return await asyncio.to_thread(self.guide.next, study)

    async def _one(self, study: optuna.Study, done: int, group: GpuGroup, slots: GroupSlots,
                   in_flight: int = 0) -> tuple[bool, bool]:
        """One candidate on one GPU group (`done` engine runs finished, `in_flight` others started);
        returns (interrupted, launched)."""
        async with self._study_lock:
            if not self.guide.active:  # the twin places the first trials after the baseline itself
                self.screening.probe_wall(study)
            # Off the event loop: a sampler's ask may take a second, and the trials running beside
            # this one must not stall meanwhile (their TTFT would grow).
            trial = await asyncio.to_thread(study.ask, self.space.distributions)
        kind = str(trial.user_attrs.get("kind", TrialKind.SEARCH))
        flags = self.space.to_flags(trial.params)
        started = time.time()
        if self._stop.is_set():  # stopped while asking: queued again, never launched
            self.recorder.interrupted(study, trial, kind, flags, started)
            return True, False
        listen_as(trial.number)
        self.on_event("trial", {"number": trial.number, "index": done + in_flight + 1, "done": done,
                                "budget": self.n_trials, "flags": flags, "kind": kind, "gpus": group.label()})
        merged = {**self.scenario.engine.flags, **flags}
        screened = self.screening.check(study, trial, kind, merged)
        if screened is not None:
            result = screened
        else:
            beat = asyncio.ensure_future(heartbeat(self._opened.storage, trial))
            pruner = pruning.for_study(study, self.scenario) if self.prune else None
            slots.launching(trial.number)
            try:
                result = await self._measure(flags, trial.number, group, pruner)
            except asyncio.CancelledError:
                record_neighbours(trial, group, slots)
                self.recorder.interrupted(study, trial, kind, flags, started)
                return True, True
            except GpusBusyError as exc:
                slots.landed(trial.number)
                self.recorder.gpus_busy(study, trial, kind, flags, str(exc), started)
                raise
            finally:
                beat.cancel()
            record_neighbours(trial, group, slots)
        launched = screened is None
        trial.set_user_attr("launched", launched)
        async with self._study_lock:
            self.recorder.tell(study, trial, kind, result, started)
        if launched:
            tripped = self.breaker.record(result.infrastructure, result.reason)
            if tripped is not None:
                self.on_event("stopped", {"reason": tripped})
        if launched and not result.infrastructure:
            self.memory.observe(trial.number, merged, result.outcome, result.memory, result.reason)
        return False, launched

    async def _measure(self, flags: dict[str, Any], number: int, group: GpuGroup,
                       pruner: pruning.Pruner | None) -> TrialResult:
        def phase(name: str) -> None:
            self.on_event("phase", {"phase": name, "number": number})

        return await measure_with_retry(self.runner, self.scenario, flags, phase, group.gpus, pruner, self._measuring)
