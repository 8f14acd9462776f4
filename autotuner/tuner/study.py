"""The study loop: ask a candidate, check vLLM's flag rules, run it through the TrialRunner, tell
Optuna the objectives and the constraints, write everything to the database before the next trial.

A plain object (`Tuner`) that a CLI command and, later, a daemon can run, stop and resume. Killing it
at any moment loses at most the trial in flight: on the next run a stale RUNNING trial is failed and
its parameters queued again, and the study continues to its study-wide budget.
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import structlog
from optuna.trial import TrialState

from autotuner.engine import classify as oc
from autotuner.errors import UserInputError
from autotuner.monitor.sampler import memory_listener
from autotuner.scenario import Scenario
from autotuner.store.db import Store, StudyRecord, TrialRecord
from autotuner.trust import DEFAULT_TOP, TRUST_KINDS
from autotuner.trust.offload import host_ram_problem
from autotuner.tuner import memory_margin, pruning
from autotuner.tuner.breaker import CircuitBreaker, machine_fault_reason
from autotuner.tuner.groups import AUTO, GpuGroup, GroupSlots, plan_groups
from autotuner.tuner.memory_model import MemoryModel, repair, warm_started
from autotuner.tuner.runner import TrialRunner
from autotuner.tuner.space import FlagRules, build_space, fit_utilization_to_free
from autotuner.tuner.trial import GPUS_BUSY, GpusBusyError, TrialResult, gpu_headroom, hold_gpus, threshold_of
from autotuner.vllm import FlagValue
from autotuner.workload.replay import request_listener

log = structlog.get_logger(__name__)

CONSTRAINT_KEYS = ("memory", "startup", "requests", "slo")
# Beyond this share of failed requests a configuration is not deployable.
MAX_FAILED_SHARE = 0.01
# Stand-in for "as slow as it gets" when no trial was feasible yet (seconds).
WORST_LATENCY_S = 600.0
INTERRUPTED = "interrupted"
OOM_PREDICTED = oc.OOM_PREDICTED
# Candidates rejected before launch (flag rules, the wall) do not use up the budget of engine runs;
# this many in a row means the space left has nothing worth launching.
MAX_FREE_IN_A_ROW = 30
SEED_GRACE_S = 60.0
# Trials after the baseline placed by the memory model to pin the wall.
WALL_PROBES = 2
# Kinds of candidates the memory model may rule out (the baseline, the user's own config and warm
# starts are measured whatever it says: they are references).
SCREENED = ("search", "repaired")

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class TuneSummary:
    study_name: str
    trials_done: int
    trials_budget: int
    oom_trials: int
    interrupted: bool  # SIGINT/SIGTERM only
    best: list[dict[str, Any]] = field(default_factory=list)  # feasible Pareto trials
    baseline: dict[str, Any] | None = None
    sampler: str = ""
    stopped_reason: str | None = None  # the circuit breaker stopped the run, and why
    ended: str = "budget"  # budget | timeout | space-exhausted | interrupted | stopped
    gpu_groups: list[str] = field(default_factory=list)  # trials side by side: each group's GPUs

    @property
    def exit_code(self) -> int:
        """`tune`'s exit status: 1 when the breaker stopped the run; else 0 — the budget or the time ran
        out, or SIGINT/SIGTERM ended it cleanly (the summary says interrupted; the next run resumes)."""
        return 1 if self.stopped_reason is not None else 0


def study_name_for(scenario: Scenario, key_digest: str) -> str:
    return f"{scenario.name}-{key_digest}"


def make_sampler(seed: int, n_trials: int) -> tuple[optuna.samplers.BaseSampler, str]:
    """Constrained multi-objective: GPSampler when its extra (torch, scipy) is installed, else TPE."""
    startup = max(4, min(10, n_trials // 4))
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup,
                                             constant_liar=True)
        return sampler, f"TPESampler(multivariate, seed={seed}) — install autotuner[gp] for GPSampler"
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup), f"GPSampler(seed={seed})"


def constraints_of(result: TrialResult, scenario: Scenario) -> dict[str, float]:
    """The same keys on every trial (GPSampler insists), continuous where measurable."""
    threshold = threshold_of(scenario)  # the sampler's threshold: fraction or min_free_mib
    out = dict.fromkeys(CONSTRAINT_KEYS, -1.0)
    out["memory"] = memory_margin.excess(result.memory, threshold)
    if result.outcome == oc.OOM_THRESHOLD:
        out["memory"] = max(out["memory"], 1e-3)
    elif result.outcome == OOM_PREDICTED:
        out["memory"] = 1e-3
    elif result.outcome == oc.OOM_CRASH:
        out["memory"] = max(out["memory"], memory_margin.crash_excess(result.memory, threshold))
    elif result.outcome in (oc.STARTUP_FAILED, oc.INVALID_FLAGS, oc.TIMEOUT, oc.CRASH):
        out["startup"] = 1.0
        out["memory"] = min(out["memory"], 0.0)
    m = result.metrics
    if result.outcome == oc.PRUNED:
        # Stopped as hopeless: never feasible; the SLO part says how far it was when stopped.
        ratios = [(m.get(metric) or 0.0) / limit - 1.0 for metric, limit in scenario.slos.items()]
        out["slo"] = max(min(max(ratios), 10.0), 1e-3) if ratios else 1e-3
    if result.outcome == oc.OK:
        total = (m.get("completed") or 0) + (m.get("failed") or 0)
        failed_share = (m.get("failed") or 0) / total if total else 1.0
        out["requests"] = failed_share - MAX_FAILED_SHARE
        ratios = [(m.get(metric) or math.inf) / limit - 1.0 for metric, limit in scenario.slos.items()]
        out["slo"] = min(max(ratios), 10.0) if ratios else -1.0
    return out


def feasible(constraints: dict[str, float]) -> bool:
    return all(v <= 0 for v in constraints.values())


class Tuner:
    def __init__(self, scenario: Scenario, runner: TrialRunner, store: Store, *, study_name: str | None = None,
                 n_trials: int | None = None, timeout_s: float | None = None, seed: int = 0,
                 on_event: Event | None = None, warm_start: str | None = None, prune: bool = True,
                 gpu_groups: str | int = AUTO) -> None:
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
        self.objectives = [o.metric for o in scenario.objectives]
        self.directions = [o.direction for o in scenario.objectives]
        self.rules = FlagRules(scenario, self.key.gpu_inventory, self.key.engine_version)
        self.breaker = CircuitBreaker()
        self._stop = asyncio.Event()
        self._signalled = False
        self._measuring: set[asyncio.Future[TrialResult]] = set()
        self._lock_fd: int | None = None
        self.gpu_groups = gpu_groups
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

    # --- study setup ---------------------------------------------------------------------------------
    def _open_study(self) -> tuple[optuna.Study, str]:
        sampler, described = make_sampler(self.seed, self.n_trials)
        storage = self._storage = self.store.optuna_storage()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(storage=storage, study_name=self.study_name, sampler=sampler,
                                    directions=self.directions, load_if_exists=True)
        known = self.store.study(self.study_name)
        if known is not None and known.key.digest() != self.key.digest():
            raise UserInputError(
                f"study {self.study_name} was tuned for another setup (model {known.key.model_fingerprint}, "
                f"{len(known.key.gpu_inventory)} GPU(s), engine {known.key.engine_version}, workload "
                f"{known.key.workload_fingerprint}); this run is model {self.key.model_fingerprint}, "
                f"{len(self.key.gpu_inventory)} GPU(s), engine {self.key.engine_version}, workload "
                f"{self.key.workload_fingerprint}. Omit --study to open a new study (and --warm-start "
                f"{self.study_name} to start from its best configs)")
        stored = [d.name.lower() for d in study.directions]
        if stored != self.directions:
            raise UserInputError(f"study {self.study_name} was created with directions {stored}, the scenario "
                                 f"asks for {self.directions}: use another --study name")
        self._created = self.store.save_study(StudyRecord(self.study_name, self.scenario.name, self.key,
                                          self.scenario.model_dump(mode="json"),
                                          str(self.scenario.source) if self.scenario.source else None,
                                          time.time()))
        return study, described

    def _lock(self) -> None:
        """One tuner per SQLite study database (several boxes share a study through PostgreSQL)."""
        if not self.store.is_sqlite:
            return
        path = Path(self.store.url.removeprefix("sqlite:///") + ".lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserInputError(f"storage {path.with_suffix('')}: cannot create its lock file {path}: "
                                 f"{exc.strerror}; the study database and its directory must be writable "
                                 "(or use another --storage)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise UserInputError(f"another autotuner (pid {other or '?'}) is tuning with {path.with_suffix('')}; "
                                 "wait for it, or use another --storage") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _recover(self, study: optuna.Study) -> list[int]:
        """Trials left RUNNING by a killed tuner: fail them and queue their parameters again. With SQLite
        we are the only worker (the lock says so); on a shared database only trials whose heartbeat
        went stale are another worker's dead ones, and Optuna re-queues them."""
        if not self.store.is_sqlite:
            before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            optuna.storages.fail_stale_trials(study)
            after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            return sorted(before - after)
        requeued = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.store.delete_trial(self.study_name, t.number)  # written just before the kill, never told
            # Optuna has no public call to fail another process's RUNNING trial; its storage API does.
            self._storage.set_trial_user_attr(t._trial_id, "outcome", INTERRUPTED)
            self._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            waiting = [w.params for w in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
            # No parameters: killed while asking (trials side by side ask while others run); nothing to redo.
            if t.params and t.params not in waiting:
                study.enqueue_trial(t.params, user_attrs={"kind": t.user_attrs.get("kind", "search"),
                                                          "requeued_from": t.number})
            requeued.append(t.number)
        return requeued

    def _seed_trials(self, study: optuna.Study) -> None:
        """Trial 0 is the baseline (vLLM's defaults for this GPU), then the user's current config."""
        trials = study.get_trials(deepcopy=False)
        if not self._created and not self.store.is_sqlite and not trials:
            # A shared study: the worker that created it seeds it, unless it died doing so long ago.
            record = self.store.study(self.study_name)
            if record is not None and time.time() - record.created_at < SEED_GRACE_S:
                return
        kinds = {t.user_attrs.get("kind") for t in trials}
        if "baseline" not in kinds:
            defaults = {k: v for k, v in self.rules.defaults().items() if k in self.space.distributions}
            study.enqueue_trial(self.space.clamp(defaults), user_attrs={"kind": "baseline"})
        if self.scenario.current_config and "current" not in kinds:
            study.enqueue_trial(self.space.clamp(self.scenario.current_config), user_attrs={"kind": "current"})
        if self.warm_start and "warm-start" not in kinds:
            for flags in self._warm_start_configs():
                study.enqueue_trial(self.space.clamp(flags), user_attrs={"kind": "warm-start"})

    def _warm_start_configs(self) -> list[dict[str, FlagValue]]:
        """After a model swap: the old study's feasible Pareto configs are good first guesses (their
        objective values do not transfer; the configurations do)."""
        name = self.warm_start
        assert name is not None
        try:
            old = optuna.load_study(study_name=name, storage=self._storage)
        except KeyError:
            raise UserInputError(f"--warm-start {name}: no such study in {self.store.url}") from None
        return [dict(t.params) for t in old.best_trials if t.user_attrs.get("feasible")][:8]

    # --- the loop ------------------------------------------------------------------------------------
    async def run(self) -> TuneSummary:
        self._lock()
        try:
            with hold_gpus(self.scenario):
                return await self._run()
        finally:
            self._unlock()

    async def _run(self) -> TuneSummary:
        # Other processes' memory on the GPUs caps the utilization that can start (GpusBusyError if
        # another autotuner holds them).
        self.space = fit_utilization_to_free(self.space, gpu_headroom(self.scenario))
        self.groups = plan_groups(self.scenario, self.gpu_groups)
        study, sampler = self._open_study()
        requeued = self._recover(study)
        self._seed_trials(study)
        labels = [g.label() for g in self.groups] if len(self.groups) > 1 else []
        log.info("tune.started", study=self.study_name, sampler=sampler, trials=self.n_trials,
                 requeued=requeued, storage=self.store.url, gpu_groups=labels)
        self.on_event("started", {"study": self.study_name, "sampler": sampler, "budget": self.n_trials,
                                  "requeued": requeued, "gpu_groups": labels})
        self._learn_wall(study)
        ended = await self._schedule(study)
        if self._signalled or self._stop.is_set():
            ended = "interrupted"
        return self._summary(study, sampler, ended)

    async def _schedule(self, study: optuna.Study) -> str:
        """Start a trial on each free GPU group while the budget allows, until the budget, the time or
        the space runs out; with one group this is one trial after the other."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        slots = GroupSlots(self.groups)
        running: dict[asyncio.Future[tuple[bool, bool]], GpuGroup] = {}
        self._free_in_a_row = 0
        ended = "budget"
        error: BaseException | None = None
        while True:
            while slots.free() and not self._stop.is_set():
                done = len(launched_trials(study))
                why = self._why_end(done + len(running), deadline)
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
                self._free_in_a_row = 0 if launched else self._free_in_a_row + 1
        if error is not None:
            raise error
        return ended

    def _why_end(self, started: int, deadline: float | None) -> str | None:
        """Why no further trial may start now (None: one may)."""
        if started >= self.n_trials:
            return "budget"
        if deadline is not None and time.monotonic() >= deadline:
            log.info("tune.timeout", study=self.study_name)
            return "timeout"
        if self._free_in_a_row >= MAX_FREE_IN_A_ROW:
            log.warning("tune.space_exhausted", study=self.study_name, rejected_in_a_row=self._free_in_a_row)
            return "space-exhausted"
        if self.breaker.tripped is not None:
            log.error("tune.stopped", study=self.study_name, reason=self.breaker.tripped)
            return "stopped"
        return None

    def _learn_wall(self, study: optuna.Study) -> None:
        # The memory model learns from every measured trial so far (a resumed study starts where it was).
        self.memory = MemoryModel.for_scenario(self.scenario, self.rules.defaults(), self.store.trials(self.study_name))
        if self.warm_start:  # after a model swap: the old study's wall, rescaled, as the prior
            self.memory = warm_started(self.memory, self.store, self.warm_start, self.scenario)

    def _probe_wall(self, study: optuna.Study) -> None:
        """The first trials after the baseline go where the memory model learns the wall fastest (just
        under it, where the best configs usually are too), instead of random spots in a space that is
        half OOM."""
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials) or not launched_trials(study):
            return
        probes = sum(t.user_attrs.get("kind") == "probe" for t in trials)
        if probes >= WALL_PROBES:
            return
        baseline = next((t for t in trials if t.user_attrs.get("kind") == "baseline"), None)
        base = {**self.scenario.engine.flags, **(self.space.to_flags(baseline.params) if baseline else {})}
        flags = self.memory.probe(self.space, base, probes) or self.memory.probe(self.space, base, probes + 1)
        if flags is not None:
            study.enqueue_trial(self.space.clamp(flags), user_attrs={"kind": "probe"})

    async def _one(self, study: optuna.Study, done: int, group: GpuGroup, slots: GroupSlots,
                   in_flight: int = 0) -> tuple[bool, bool]:
        """One candidate on one GPU group (`done` engine runs finished, `in_flight` others started);
        returns (interrupted, launched)."""
        async with self._study_lock:
            self._probe_wall(study)
            # Off the event loop: a sampler's ask may take a second, and the trials running beside
            # this one must not stall meanwhile (their TTFT would grow).
            trial = await asyncio.to_thread(study.ask, self.space.distributions)
        kind = str(trial.user_attrs.get("kind", "search"))
        flags = self.space.to_flags(trial.params)
        started = time.time()
        if self._stop.is_set():  # stopped while asking: queued again, never launched
            self._record_interrupted(study, trial, kind, flags, started)
            return True, False
        self._listen_as(trial.number)
        self.on_event("trial", {"number": trial.number, "index": done + in_flight + 1, "done": done,
                                "budget": self.n_trials, "flags": flags, "kind": kind, "gpus": group.label()})
        merged = {**self.scenario.engine.flags, **flags}
        violation = self.rules.violation(merged) or host_ram_problem(self.scenario, merged)
        wall = self.memory.screen(merged) if kind in SCREENED and violation is None else None
        if violation is not None:
            result = TrialResult(oc.INVALID_FLAGS, violation, merged, [])
        elif wall is not None:
            result = TrialResult(OOM_PREDICTED, f"not launched: {wall.reason}", merged, [])
            for name, value in wall.to_attrs().items():
                trial.set_user_attr(name, value)
            nearest = repair(self.memory, self.space, merged) if kind == "search" else None
            if nearest is not None:  # measured next, in the sampler's place
                study.enqueue_trial(self.space.clamp(nearest), user_attrs={"kind": "repaired",
                                                                           "repaired_from": trial.number})
        else:
            beat = asyncio.ensure_future(self._heartbeat(trial))
            judged = pruning.judge.set(self._pruner(study)) if self.prune else None
            slots.launching(trial.number)
            try:
                result = await self._measure(flags, trial.number, group)
            except asyncio.CancelledError:
                self._side_by_side(trial, group, slots)
                self._record_interrupted(study, trial, kind, flags, started)
                return True, True
            except GpusBusyError as exc:
                # Never launched: end the trial (not RUNNING forever) and queue the candidate again.
                slots.landed(trial.number)
                trial.set_user_attr("outcome", GPUS_BUSY)
                trial.set_user_attr("reason", str(exc))
                study.tell(trial, state=TrialState.FAIL)
                study.enqueue_trial(trial.params, user_attrs={"kind": kind, "requeued_from": trial.number})
                self._save(trial.number, kind, TrialResult(GPUS_BUSY, str(exc), {**self.scenario.engine.flags,
                                                                                 **flags}, []), "FAIL", started)
                raise
            finally:
                beat.cancel()
                if judged is not None:
                    pruning.judge.reset(judged)
            self._side_by_side(trial, group, slots)
        launched = violation is None and wall is None
        trial.set_user_attr("launched", launched)
        async with self._study_lock:
            self._tell(study, trial, kind, result, started)
        if launched:
            tripped = self.breaker.record(result.infrastructure, result.reason)
            if tripped is not None:
                self.on_event("stopped", {"reason": tripped})
        if launched and not result.infrastructure:
            self.memory.observe(trial.number, merged, result.outcome, result.memory, result.reason)
        return False, launched

    def _pruner(self, study: optuna.Study) -> pruning.Pruner:
        # Every feasible trial, not only the front: a trial is stopped only when enough of them beat it for
        # confirmation's candidates (the front and its runners-up) to be complete without it.
        feasible = [pruning.FrontPoint(t.number, dict(zip(self.objectives, t.values, strict=True)))
                    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.user_attrs.get("feasible") and t.user_attrs.get("kind") not in TRUST_KINDS]
        return pruning.Pruner(self.scenario.slos, list(zip(self.objectives, self.directions, strict=True)), feasible,
                              keep=DEFAULT_TOP)

    def _side_by_side(self, trial: optuna.Trial, group: GpuGroup, slots: GroupSlots) -> None:
        """Noise the numbers carry: the trial's GPUs and the trials that ran beside it (sharing CPU, PCIe
        and host RAM); confirmation re-measures alone."""
        neighbours = slots.landed(trial.number)
        if group.gpus is not None:
            trial.set_user_attr("gpu_group", list(group.gpus))
            trial.set_user_attr("neighbours", neighbours)

    def _listen_as(self, number: int) -> None:
        """The live view's memory and request listeners, told which trial they hear (this task's context
        only: trials side by side each have their own)."""
        for var in (memory_listener, request_listener):
            heard = var.get()
            if heard is not None:
                var.set(_Tagged(heard, number))  # type: ignore[arg-type]

    async def _heartbeat(self, trial: optuna.Trial) -> None:
        interval = self._storage.get_heartbeat_interval()
        while interval:
            await asyncio.to_thread(self._storage.record_heartbeat, trial._trial_id)
            await asyncio.sleep(interval)

    async def _measure(self, flags: dict[str, FlagValue], number: int, group: GpuGroup) -> TrialResult:
        def phase(name: str) -> None:
            self.on_event("phase", {"phase": name, "number": number})

        for attempt in (1, 2):
            task = asyncio.ensure_future(self.runner.run(flags, phase, gpus=group.gpus))
            self._measuring.add(task)
            try:
                result = await task
            except (UserInputError, GpusBusyError):
                raise  # nothing the next candidate could do better: end the study with the message
            except Exception as exc:  # a fault of ours or of the machine, not of the candidate
                log.exception("trial.internal_error", flags=flags)
                result = TrialResult(oc.CRASH, f"internal error: {type(exc).__name__}: {exc}",
                                     {**self.scenario.engine.flags, **flags}, [], infrastructure=True)
            finally:
                self._measuring.discard(task)
            machine = None if result.infrastructure else _machine_fault(result)
            if machine is not None:
                # Not the candidate's fault, and no retry would change it: a FAIL trial for the breaker.
                result.infrastructure = True
                result.reason = f"{result.reason}: {machine}" if result.reason and machine not in result.reason \
                    else machine
                return result
            if not result.infrastructure or attempt == 2:
                return result
            log.warning("trial.infrastructure_retry", reason=result.reason)
        raise AssertionError("unreachable")

    def _placeholders(self, study: optuna.Study) -> list[float]:
        """Worst feasible values so far: the sampler learns the wall without a fake optimum."""
        feasible_values = [t.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                           if t.user_attrs.get("feasible")]
        out = []
        for i, direction in enumerate(self.directions):
            seen = [v[i] for v in feasible_values]
            if direction == "maximize":
                out.append(min(seen) if seen else 0.0)
            else:
                out.append(max(seen) if seen else WORST_LATENCY_S)
        return out

    def _tell(self, study: optuna.Study, trial: optuna.Trial, kind: str, result: TrialResult, started: float) -> None:
        if result.infrastructure:
            trial.set_user_attr("outcome", result.outcome)
            trial.set_user_attr("reason", result.reason)
            study.tell(trial, state=TrialState.FAIL)
            self._save(trial.number, kind, result, "FAIL", started)
            self.on_event("finished", {"number": trial.number, "outcome": result.outcome, "state": "FAIL",
                                       "reason": result.reason, "kind": kind,
                                       "peak_fraction": result.memory.get("peak_fraction")})
            return
        constraints = constraints_of(result, self.scenario)
        ok = feasible(constraints)
        values = [result.metrics.get(metric) for metric in self.objectives]
        if not ok or any(v is None for v in values):
            values = self._placeholders(study)
            ok = False
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        attrs = {"kind": kind, "outcome": result.outcome, "reason": result.reason, "feasible": ok,
                 "constraints": constraints, "peak_fraction": result.memory.get("peak_fraction"),
                 **{f"metric:{k}": v for k, v in result.metrics.items() if isinstance(v, int | float)}}
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        # Ours first: if we die between the two writes, the resumed run finds the trial RUNNING, drops
        # our row and measures the candidate again — nothing duplicated, at most this trial lost.
        self._save(trial.number, kind, result, "COMPLETE", started)
        study.tell(trial, values=[float(v) for v in values])  # type: ignore[arg-type]
        log.info("trial.finished", study=self.study_name, number=trial.number, kind=kind, outcome=result.outcome,
                 feasible=ok, flags=result.flags, reason=result.reason,
                 **{m: result.metrics.get(m) for m in self.objectives},
                 peak_fraction=result.memory.get("peak_fraction"))
        self.on_event("finished", {"number": trial.number, "outcome": result.outcome, "feasible": ok,
                                   "values": values, "state": "COMPLETE", "reason": result.reason,
                                   "flags": result.flags, "kind": kind, "metrics": result.metrics,
                                   "peak_fraction": result.memory.get("peak_fraction"), "constraints": constraints})

    def _save(self, number: int, kind: str, result: TrialResult, state: str, started: float) -> None:
        data = result.to_dict()
        timeline = (data.get("memory") or {}).get("timeline") or []
        self.store.save_trial(self.study_name, TrialRecord(
            trial_number=number, kind=kind, outcome=result.outcome, reason=result.reason, state=state,
            flags=result.flags, result=data, timeline=timeline, log_tail=result.log_tail,
            started_at=started, finished_at=time.time()))

    def _record_interrupted(self, study: optuna.Study, trial: optuna.Trial, kind: str,
                            flags: dict[str, FlagValue], started: float) -> None:
        trial.set_user_attr("kind", kind)
        trial.set_user_attr("outcome", INTERRUPTED)
        study.tell(trial, state=TrialState.FAIL)
        # The interrupted candidate is measured again when the study resumes.
        study.enqueue_trial(trial.params, user_attrs={"kind": kind, "requeued_from": trial.number})
        result = TrialResult(INTERRUPTED, "the tuner was asked to stop", {**self.scenario.engine.flags, **flags}, [])
        self._save(trial.number, kind, result, "FAIL", started)
        self.on_event("finished", {"number": trial.number, "outcome": INTERRUPTED, "state": "FAIL"})

    def _summary(self, study: optuna.Study, sampler: str, ended: str) -> TuneSummary:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        ooms = sum(1 for t in complete if t.user_attrs.get("outcome") in (oc.OOM_THRESHOLD, oc.OOM_CRASH))
        best = [{"number": t.number, "values": t.values, "params": self.space.to_flags(t.params)}
                for t in study.best_trials if t.user_attrs.get("feasible")]
        baseline = next(({"number": t.number, "outcome": t.user_attrs.get("outcome"), "values": t.values}
                         for t in complete if t.user_attrs.get("kind") == "baseline"), None)
        summary = TuneSummary(self.study_name, len(launched_trials(study)), self.n_trials, ooms,
                              ended == "interrupted", best, baseline, sampler,
                              self.breaker.tripped if ended == "stopped" else None, ended,
                              [g.label() for g in self.groups] if len(self.groups) > 1 else [])
        log.info("tune.finished", study=self.study_name, trials=summary.trials_done, oom_trials=ooms,
                 not_launched=len(complete) - summary.trials_done,
                 pareto=len(best), ended=ended, stopped_reason=summary.stopped_reason)
        return summary


class _Tagged:
    """A listener that adds the trial's number to what it hears."""

    def __init__(self, listener: Event, number: int) -> None:
        self.listener, self.number = listener, number

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.listener(kind, {**data, "number": self.number})


def _machine_fault(result: TrialResult) -> str | None:
    """The machine's fault in a failed engine start or run (see breaker.py), or None when the
    candidate may be to blame. Memory failures are always the candidate's."""
    if result.outcome not in (oc.CRASH, oc.STARTUP_FAILED):  # a slow start (timeout) is not a broken one
        return None
    if "memory" in (result.reason or "").lower():
        return None
    return machine_fault_reason(result.reason, result.log_tail)


def launched_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that ran an engine: what the budget counts."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("launched", True) and t.user_attrs.get("kind") not in TRUST_KINDS]


def parse_duration(text: str | None) -> float | None:
    """`8h`, `90m`, `45s`, `1h30m`, or plain seconds."""
    if text is None:
        return None
    import re

    total = 0.0
    matched = False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip()):
        matched = True
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
    if not matched or re.sub(r"[\d.\shms]", "", text):
        raise UserInputError(f"duration {text!r}: expected e.g. 8h, 90m, 45s or 1h30m")
    return total
