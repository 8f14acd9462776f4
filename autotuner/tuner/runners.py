"""The seam between the study loop and what a trial is: candidate flags in, TrialResult out.

`MeasureRunner` runs one real engine lifetime (vLLM or the simulator as a process). `VirtualRunner`
evaluates the simulator's engine core in virtual time: the same study, storage, export and report,
in seconds — "tune this model for a GPU box I do not own yet", and the loop's own benchmark.
Which one a scenario gets, and what its study key says, is its backend's answer (autotuner.backends).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from autotuner.backends import SIM_VIRTUAL, Backend, backend_for
from autotuner.catalog.gpus import GpuSpec
from autotuner.engine.classify import clean_reason
from autotuner.engine.registry import EngineRegistry
from autotuner.errors import ScenarioError
from autotuner.scenario import Scenario
from autotuner.sim.args import VLLM_VERSION, VllmArgError, build_config, parse_args
from autotuner.sim.core import SimRequest
from autotuner.sim.evaluate import EvalRequest, evaluate, synthetic_requests
from autotuner.store.db import StudyKey
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import Phase, TrialResult
from autotuner.trials.scoring import threshold_of
from autotuner.tuner import pruning
from autotuner.tuner.lifecycle import measure, measure_lifetime
from autotuner.vllm import FlagValue, flag_argv
from autotuner.workload.spec import LengthDist, replay_first


class TrialRunner(ABC):
    """Runs one candidate. Implementations never raise for a candidate's failure."""

    @abstractmethod
    async def run(self, flags: Mapping[str, FlagValue], on_phase: Phase | None = None, *,
                  gpus: Sequence[int] | None = None, pruner: pruning.Pruner | None = None) -> TrialResult:
        """`gpus`: the trial's own GPU group (NVML indices) when trials run side by side; None: the
        scenario's GPUs. `pruner`: asked during the workload whether the trial is hopeless (None:
        never stopped early)."""

    async def run_lifetime(self, flags: Mapping[str, FlagValue], runs: int, on_phase: Phase | None = None,
                           then: Scenario | None = None) -> list[TrialResult]:
        """Up to `runs` replays of the workload on one engine lifetime (fewer once one does not end ok).
        With `then` (another workload for the same flags: the soak), once all `runs` ended ok the same
        engine serves it as well: its result is the one after the first `runs`. A runner that cannot
        replay within a lifetime runs once (and never `then`: the caller starts its own engine for it)."""
        return [await self.run(flags, on_phase)]

    @abstractmethod
    def study_key(self) -> StudyKey:
        """What makes two studies comparable: model, GPUs, engine version, workload."""


def workload_fingerprint(scenario: Scenario) -> str:
    blob = json.dumps(scenario.workload.model_dump(mode="json"), sort_keys=True)
    if scenario.workload.requests.kind == "trace" and scenario.workload.requests.path:
        trace = scenario.resolve(scenario.workload.requests.path)
        blob += hashlib.sha256(trace.read_bytes()).hexdigest() if trace.is_file() else ""
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def model_fingerprint(scenario: Scenario) -> str:
    """The shape and weights' identity: config.json (and the weight index) of a local model directory,
    the preset's shape for the simulator, else the model name (the backend's answer)."""
    return backend_for(scenario).model_fingerprint(scenario)


def backend_study_key(backend: Backend, scenario: Scenario) -> StudyKey:
    """The study key as `backend` names the scenario's GPUs, engine and model."""
    inventory = backend.gpu_inventory(scenario)
    version = backend.engine_version(scenario)
    return StudyKey(backend.model_fingerprint(scenario), inventory, version, workload_fingerprint(scenario))


class MeasureRunner(TrialRunner):
    def __init__(self, scenario: Scenario, log_dir: Path, registry: EngineRegistry | None = None) -> None:
        self.scenario = scenario
        self.log_dir = log_dir
        self.registry = registry or EngineRegistry()

    async def run(self, flags: Mapping[str, FlagValue], on_phase: Phase | None = None, *,
                  gpus: Sequence[int] | None = None, pruner: pruning.Pruner | None = None) -> TrialResult:
        scenario = self.scenario if gpus is None else on_gpus(self.scenario, gpus)
        return await measure(scenario, flags, log_dir=self.log_dir, registry=self.registry, on_phase=on_phase,
                             pruner=pruner)

    async def run_lifetime(self, flags: Mapping[str, FlagValue], runs: int, on_phase: Phase | None = None,
                           then: Scenario | None = None) -> list[TrialResult]:
        return await measure_lifetime(self.scenario, flags, runs=runs, log_dir=self.log_dir, registry=self.registry,
                                      on_phase=on_phase, then=then)

    def study_key(self) -> StudyKey:
        return backend_study_key(backend_for(self.scenario), self.scenario)


def on_gpus(scenario: Scenario, gpus: Sequence[int]) -> Scenario:
    """The scenario with its engine pinned to `gpus`: CUDA_VISIBLE_DEVICES, the memory monitor and the
    per-GPU locks all follow engine.gpus."""
    return scenario.model_copy(update={"engine": scenario.engine.model_copy(update={"gpus": list(gpus)})})


class VirtualRunner(TrialRunner):
    """The simulator's engine core in virtual time, deterministic for the scenario's seeds."""

    def __init__(self, scenario: Scenario, first_run: int = 0, gpu: GpuSpec | None = None,
                 within: float = 0.0) -> None:
        if scenario.workload.requests.kind != "synthetic":
            raise ScenarioError(f"{scenario.source or 'scenario'}: engine.kind sim-virtual takes synthetic "
                                "workloads only (token counts, no text); replay a trace with kind sim or vllm")
        self.scenario = scenario
        self.threshold = threshold_of(scenario)
        self._requests_cache: dict[int, list[EvalRequest]] = {}
        # Each evaluation is another run of the simulated engine (another noise draw), like each
        # engine launch on a real box; `first_run` lets a caller start on fresh draws.
        self.runs = first_run
        self.gpu = gpu  # the GPU as given (the twin's calibrated preset) instead of engine.sim.gpu's
        # Spread between replays on one engine (sim/noise.py); 0: a lifetime's replays measure alike.
        self.within = within

    def study_key(self) -> StudyKey:
        return backend_study_key(SIM_VIRTUAL, self.scenario)

    def _argv(self, flags: Mapping[str, FlagValue], run: int | None = None) -> list[str]:
        return [self.scenario.engine.model, *flag_argv({**self.scenario.engine.flags, **flags}),
                *SIM_VIRTUAL.argv_extras(self.scenario, run=self.runs if run is None else run)]

    def requests(self, vocab_size: int) -> tuple[list[EvalRequest], int | None]:
        """The scenario's workload as the evaluator takes it (same seeds → same requests)."""
        w = self.scenario.workload
        r = w.requests
        if vocab_size not in self._requests_cache:
            prompt = LengthDist(**r.prompt_tokens.model_dump())
            output = LengthDist(**r.output_tokens.model_dump())
            a = w.arrivals
            burst = (a.burst_size, a.burst_interval_s) \
                if a.kind == "burst" and a.burst_size and a.burst_interval_s is not None else None
            # The lengths that must be replayed (a production crash's step) come first, each once.
            count = max(r.count, len(r.include_prompt_tokens))
            self._requests_cache[vocab_size] = synthetic_requests(
                (w.max_requests and min(w.max_requests, count)) or count,
                replay_first(r.include_prompt_tokens, prompt.sample), output.sample,
                seed=w.seed, vocab_size=vocab_size, rate=a.rate if a.kind == "poisson" else None, burst=burst,
                shared_prefix_tokens=r.shared_prefix_tokens, shared_prefix_fraction=r.shared_prefix_fraction,
                ignore_eos=w.ignore_eos)
        concurrency = w.arrivals.concurrency if w.arrivals.kind == "concurrency" else None
        return self._requests_cache[vocab_size], concurrency

    async def run(self, flags: Mapping[str, FlagValue], on_phase: Phase | None = None, *,
                  gpus: Sequence[int] | None = None, pruner: pruning.Pruner | None = None) -> TrialResult:
        # In a worker thread: a long evaluation must not hold the event loop of the process running it
        # (the daemon's /status, the live view, other trials' heartbeats).
        return await asyncio.to_thread(self.evaluate, flags, pruner)

    async def run_lifetime(self, flags: Mapping[str, FlagValue], runs: int, on_phase: Phase | None = None,
                           then: Scenario | None = None) -> list[TrialResult]:
        # The simulated engine's noise is drawn once per lifetime (sim/noise.py): without `within`, replays
        # within one lifetime measure alike, which is what confirmation must be able to see.
        first = await self.run(flags, on_phase)
        out = [first]
        while len(out) < runs and out[-1].outcome == Outcome.OK:
            if self.within <= 0:
                out.append(copy.deepcopy(first))
            else:
                out.append(await asyncio.to_thread(self.evaluate, flags, None, len(out)))
        if then is not None and len(out) == runs and out[-1].outcome == Outcome.OK:
            # The same lifetime (its draw) under the other workload.
            other = VirtualRunner(then, first_run=self.runs, gpu=self.gpu, within=self.within)
            out.append(await asyncio.to_thread(other.evaluate, flags, None, len(out)))
        return out

    def evaluate(self, flags: Mapping[str, FlagValue], pruner: pruning.Pruner | None = None,
                 replay: int = 0) -> TrialResult:
        """One run; `replay` > 0: another replay on the engine of the last run (its lifetime's draw)."""
        run = self.runs - 1 if replay else self.runs
        self.runs += 0 if replay else 1
        argv = self._argv(flags, run)
        merged = {**self.scenario.engine.flags, **flags}
        result = TrialResult(Outcome.OK, None, dict(merged), ["autotuner", "sim", "evaluate", *argv])
        try:
            config = build_config(parse_args(argv), self.scenario.engine.resolved_env())
            if self.gpu is not None:
                config = replace(config, sim=replace(config.sim, gpu=self.gpu))
            if self.within > 0:
                config = replace(config, sim=replace(config.sim, within=self.within, replay=replay))
        except VllmArgError as exc:
            result.outcome = Outcome.INVALID_FLAGS
            result.reason = clean_reason(exc.message.splitlines()[-1])
            return result
        reqs, concurrency = self.requests(config.model.vocab_size)
        sims: list[SimRequest] = []
        ev = evaluate(config, reqs, concurrency, sims if pruner is not None else None)
        result.engine = {"version": f"{VLLM_VERSION} (simulated)", "kv_cache_tokens": ev.kv_cache_tokens,
                         "preemptions": ev.preemptions, "kv_cache_usage_max": None,
                         "max_num_batched_tokens": config.max_num_batched_tokens, "log_path": None,
                         "model_load_gib": ev.startup.get("weights_gib"),
                         "offloaded_gib": ev.startup.get("offloaded_gib"),
                         "sim_noise": config.sim.noise, "sim_run": config.sim.run}
        if ev.outcome == "startup-failed":
            result.outcome, result.reason = Outcome.STARTUP_FAILED, ev.reason
            return result
        peaks = list(ev.memory["peak_bytes"])  # type: ignore[call-overload]
        total = int(ev.memory["total_bytes"])  # type: ignore[call-overload]
        result.memory = {"peak_bytes": peaks, "total_bytes": [total] * len(peaks),
                         "peak_fraction": ev.memory["peak_fraction"], "samples": 0, "sample_hz": None,
                         "devices": list(config.gpu_indices), "timeline": [],
                         "steady_bytes": ev.memory["steady_bytes"]}
        result.metrics = {k: ev.metrics.get(k) for k in (
            "output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p90_s",
            "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s", "completed", "failed", "duration_s")}
        limit = self.threshold.limit_bytes(total)
        if ev.outcome == "oom":
            result.outcome, result.reason = Outcome.OOM_CRASH, ev.reason
            result.memory["peak_fraction"] = 1.0  # the failed allocation went past the card
        elif max(peaks) >= limit:
            # A real trial would have been stopped here, at the threshold.
            result.outcome = Outcome.OOM_THRESHOLD
            result.reason = (f"peak {max(peaks) / 2**30:.2f} GiB ≥ threshold {limit / 2**30:.2f} GiB of "
                             f"{total / 2**30:.2f} GiB")
        if result.outcome != Outcome.OK:
            result.metrics = {}
        elif pruner is not None:
            _prune_in_virtual_time(result, pruner, sims, len(reqs))
        return result


def _prune_in_virtual_time(result: TrialResult, pruner: pruning.Pruner, sims: list[SimRequest], total: int) -> None:
    """Ask the pruner at each completion, as the live replay would have: the first verdict stops the
    run there (what the rest of the run would have shown is dropped, as it would never have been seen).
    The memory peak stays the whole run's (the virtual core keeps no timeline): a bound from above."""
    start = min((s.arrival for s in sims), default=0.0)
    done: list[pruning.Done] = []
    for s in sorted((s for s in sims if s.finished_at is not None), key=lambda s: s.finished_at or 0.0):
        assert s.finished_at is not None
        ttft = None if s.first_token is None else s.first_token - s.arrival
        tpot = (s.finished_at - s.first_token) / (s.output_len - 1) \
            if s.first_token is not None and s.output_len > 1 else None
        done.append(pruning.Done(s.finished_at - start, True, s.output_len, ttft, tpot, s.finished_at - s.arrival))
        partial = pruning.Partial(s.finished_at - start, total, list(done))
        reason = pruner.check(partial)
        if reason is not None:
            result.outcome, result.reason = Outcome.PRUNED, reason
            result.metrics = partial.metrics()
            return


def runner_for(scenario: Scenario, log_dir: Path, first_run: int = 0) -> TrialRunner:
    """The runner that measures the scenario's candidates: an engine process per trial where the backend
    runs one, else the simulator's core in virtual time (`first_run`: its first noise draw)."""
    if backend_for(scenario).runs_process:
        return MeasureRunner(scenario, log_dir)
    return VirtualRunner(scenario, first_run=first_run)
