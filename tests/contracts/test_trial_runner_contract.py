"""The trial-runner contract: what the study loop may rely on from any `TrialRunner`, whichever runs the trial.

Run over every implementation: `MeasureRunner` on engine kind `sim` (the simulator as a real `autotuner sim
serve` process over HTTP, its memory watched through the simulated NVML) and `VirtualRunner` (`sim-virtual`,
the simulator's engine core in virtual time). The study swaps one for the other by `engine.kind` alone, so
what one promises, both must keep:

- a safe candidate is `ok`, serves every request and reports the metric summary's full key set (every
  figure an SLO can name included), with memory evidence for every GPU of the scenario (engine.gpus, else
  the whole box) whose peak is the engine's, below the wall;
- the result names the flags it ran (the scenario's merged with the candidate's), and its engine info
  carries the token budget asked for;
- a candidate past the OOM wall is an outcome, never an exception: `oom-threshold` when its peak crosses the
  threshold, `oom-crash` when an allocation fails; no room for the KV cache is `startup-failed` with the
  engine's words (the memory model learns from them); bad flags are `invalid-flags` with vLLM's message,
  cleaned as the log classifier cleans it;
- `run(gpus=G)` measures the trial on the GPU group G;
- nothing of a trial outlives `run()`: no engine in the registry, no memory held on the simulated GPUs;
- `study_key()` is stable and changes with the workload or the model, not with the study's budget;
- `run_lifetime(flags, n)` replays the workload up to n times on one engine: n results of a safe candidate,
  each serving every request and carrying the lifetime's memory peak, nothing left afterwards; a lifetime
  that fails is one failed result, never asked for more; with `then` (the soak) the same engine serves
  another workload after the n replays, whose failure (past the wall) is its own, not the replays before it.

Each trial is tiny: the quickstart case at tensor parallel 2, four short requests, the simulator 100x.
One (runner, candidate) trial is run once per module and its observations shared by the clauses on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from autotuner.analysis.slo import METRICS as SLO_METRICS
from autotuner.engine.registry import EngineEntry, EngineRegistry
from autotuner.scenario import Scenario, load_scenario
from autotuner.sim.args import VLLM_VERSION
from autotuner.sim.gpu_state import GpuHost, state_dir_from_env
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import TrialResult
from autotuner.tuner.runners import MeasureRunner, TrialRunner, VirtualRunner
from autotuner.vllm import FlagValue
from autotuner.workload.summary import summarize
from tests.support.quickstart import set_path
from tests.support.waiting import wait_for

ROOT = Path(__file__).parent.parent.parent
KINDS = ["sim", "sim-virtual"]
TP = 2
REQUESTS = 4
THRESHOLD = 0.97  # the quickstart's oom_threshold.fraction

# On the quickstart box (8x RTX 3090, llama-2-13b at TP 2, prompts of 2000-4000 tokens), from sim/memory.py:
SAFE = {"max-num-batched-tokens": 1024, "gpu-memory-utilization": 0.8}  # peak ~0.83 of the card
OVER_THRESHOLD = {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.94}  # steps climb to ~0.99
# A step's allocation fails even for one prompt prefilled alone (at 0.9 it took several in one batch, and a busy
# box's CI run prefilled them one by one).
ALLOCATION_FAILS = {"max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.95}
NO_KV_ROOM = {"gpu-memory-utilization": 0.5}  # the weights fit, no KV cache block does

# Known bugs (each a clause one implementation breaks; see the report of this suite).
VIRTUAL_METRICS = ("VirtualRunner reports a subset of the metric summary: no queue_p95_s, prompt_tokens or "
                   "output_tokens, so an SLO on queue_p95 never passes on a sim-virtual study")
VIRTUAL_DEVICES = ("VirtualRunner reports memory for the engine's TP GPUs only; MeasureRunner for every GPU of the "
                   "scenario (engine.gpus, else the whole box), as TrialRunner.run documents for gpus=None")
VIRTUAL_GPUS = "VirtualRunner.run ignores `gpus`: the trial is evaluated (and reported) on GPUs 0..TP-1"


def tiny_scenario(tmp_path: Path, kind: str, name: str = "tiny", **changes: object) -> Scenario:
    """The quickstart case shrunk to about a second per real trial; `a__b=v` sets data["a"]["b"] = v."""
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"].update(kind=kind, startup_timeout_s=30, stop_grace_s=5, release_timeout_s=10)
    data["engine"]["flags"] = {"tensor-parallel-size": TP, "max-model-len": 4096}
    data["engine"]["sim"]["speedup"] = 100
    data["workload"]["requests"].update(count=REQUESTS, output_tokens=16,
                                        prompt_tokens={"kind": "uniform", "low": 2000, "high": 4000})
    data["workload"]["request_timeout_s"] = 30
    data["storage"] = f"sqlite:///{tmp_path / 'study.db'}"
    for dotted, value in changes.items():
        set_path(data, dotted, value)
    out = tmp_path / f"{name}-{kind}.yaml"
    out.write_text(yaml.safe_dump(data))
    return load_scenario(out)


def make_runner(scenario: Scenario, tmp_path: Path) -> TrialRunner:
    """As `autotuner tune` builds it (cli/tune.py): the engine kind alone picks the implementation."""
    if scenario.engine.kind == "sim-virtual":
        return VirtualRunner(scenario)
    return MeasureRunner(scenario, tmp_path / "logs")


@dataclass
class Ran:
    """One trial and what was left of it right after `run()` returned."""

    scenario: Scenario
    candidate: dict[str, FlagValue]
    result: TrialResult
    engines_left: list[EngineEntry]
    gpu_bytes_left: list[int]


@dataclass(frozen=True)
class Case:
    candidate: Mapping[str, FlagValue]
    changes: tuple[tuple[str, object], ...] = ()
    gpus: tuple[int, ...] | None = None


CASES = {
    "safe": Case(SAFE),
    "over-threshold": Case(OVER_THRESHOLD),
    # The footprint before the failing allocation brushes 0.97: the threshold is moved out of the way, so the
    # allocation alone decides (as tests/tuner/test_trial.py does for its crash). At 10x, not 100x, as before.
    "allocation-fails": Case(ALLOCATION_FAILS, (("oom_threshold__fraction", 0.999), ("engine__sim__speedup", 10))),
    # At 100x the startup fails before the trial's first 0.5 s watch tick puts the workers on record: their
    # memory, still held while it is released, is known ours from the PIDs the engine's log named.
    "no-kv-room": Case(NO_KV_ROOM),
    "on-gpus-4-5": Case(SAFE, gpus=(4, 5)),
    "budget-below-max-num-seqs": Case({"max-num-batched-tokens": 64, "max-num-seqs": 128}),
    "unknown-option": Case({"no-such-option": 1}),
    "not-a-number": Case({"max-num-batched-tokens": "lots"}),
}


class Trials:
    """Each (runner kind, case) runs once per module, in the environment of the first test that asks for it
    (its own $AUTOTUNER_HOME and simulated GPUs); the clauses on that trial read the recorded observations."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, str], Ran] = {}

    def get(self, kind: str, case_name: str, tmp_path: Path) -> Ran:
        key = (kind, case_name)
        if key not in self._done:
            case = CASES[case_name]
            scenario = tiny_scenario(tmp_path, kind, case_name, **dict(case.changes))
            runner = make_runner(scenario, tmp_path)
            result = asyncio.run(runner.run(dict(case.candidate), gpus=case.gpus))
            self._done[key] = Ran(scenario, dict(case.candidate), result, EngineRegistry().entries(),
                                  _gpu_bytes_settled(scenario))
        return self._done[key]


def _gpu_bytes_settled(scenario: Scenario) -> list[int]:
    """What the simulated GPUs hold once a dead process's memory had time to go (the simulator releases it
    0.5 s after its holder's last heartbeat); all zeros when nothing is held."""
    host = GpuHost(state_dir_from_env())

    def used() -> list[int]:
        return [host.used_bytes(i) for i in range(scenario.sim_gpu_count())]

    with contextlib.suppress(AssertionError):  # the clause that reads the bytes fails, naming them
        wait_for(lambda: not any(used()), timeout=3, what="the simulated GPUs to be free")
    return used()


@pytest.fixture(scope="module")
def trials() -> Trials:
    return Trials()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Every runner implementation, by the scenario's engine.kind that selects it."""
    return str(request.param)


def known_bug(request: pytest.FixtureRequest, kind: str, broken: str, reason: str) -> None:
    """Mark this case of a clause as a known bug of the `broken` implementation (strict: it must fail)."""
    if kind == broken:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


# --- a safe candidate ----------------------------------------------------------------------------------


def test_a_safe_candidate_is_ok_and_serves_every_request(kind: str, trials: Trials, tmp_path: Path) -> None:
    ran = trials.get(kind, "safe", tmp_path)
    r = ran.result
    assert r.outcome == Outcome.OK and r.feasible, r.reason
    assert r.reason is None
    assert r.metrics["completed"] == REQUESTS and r.metrics["failed"] == 0
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p95_s",
                "tpot_p50_s", "e2e_p95_s", "duration_s"):
        value = r.metrics[key]
        assert value is not None and value > 0, key
    assert r.metrics["ttft_p50_s"] <= r.metrics["ttft_p95_s"] <= r.metrics["ttft_p99_s"]


def test_ok_metrics_have_the_summary_key_set(request: pytest.FixtureRequest, kind: str, trials: Trials,
                                             tmp_path: Path) -> None:
    """The study, the store and the report read one metric summary (workload/summary.py), whatever ran."""
    known_bug(request, kind, "sim-virtual", VIRTUAL_METRICS)
    r = trials.get(kind, "safe", tmp_path).result
    assert set(r.metrics) == set(summarize([], 0.0, 1.0))


def test_ok_metrics_hold_every_figure_an_slo_can_name(request: pytest.FixtureRequest, kind: str, trials: Trials,
                                                      tmp_path: Path) -> None:
    """`export --slo` filters on these; a missing figure never meets an SLO (analysis/slo.py)."""
    known_bug(request, kind, "sim-virtual", VIRTUAL_METRICS)
    r = trials.get(kind, "safe", tmp_path).result
    missing = [m for m in SLO_METRICS if r.metrics.get(m) is None]
    assert missing == []


def test_ok_memory_evidence_covers_the_scenarios_gpus(request: pytest.FixtureRequest, kind: str, trials: Trials,
                                                      tmp_path: Path) -> None:
    """`gpus=None` runs on "the scenario's GPUs" (TrialRunner.run): engine.gpus, else the whole box."""
    known_bug(request, kind, "sim-virtual", VIRTUAL_DEVICES)
    ran = trials.get(kind, "safe", tmp_path)
    mem = ran.result.memory
    box = list(range(ran.scenario.sim_gpu_count()))
    peaks, totals = mem["peak_bytes"], mem["total_bytes"]
    assert isinstance(peaks, list) and isinstance(totals, list)
    assert mem["devices"] == box
    assert len(peaks) == len(totals) == len(box)


def test_ok_memory_peak_is_the_engines_below_the_wall(kind: str, trials: Trials, tmp_path: Path) -> None:
    """The engine's GPUs (the first TP of them) show its weights and KV cache; any other GPU reported holds
    nothing; peak_fraction is the largest peak over its card's total."""
    mem = trials.get(kind, "safe", tmp_path).result.memory
    devices, peaks, totals = mem["devices"], mem["peak_bytes"], mem["total_bytes"]
    assert isinstance(devices, list) and isinstance(peaks, list) and isinstance(totals, list)
    assert len(devices) == len(peaks) == len(totals)
    share = {d: p / t for d, p, t in zip(devices, peaks, totals, strict=True)}
    assert all(0.5 < share[d] < THRESHOLD for d in range(TP)), share  # util 0.8: below the wall
    assert all(share[d] == 0 for d in devices if d >= TP), share
    assert mem["peak_fraction"] == pytest.approx(max(share.values()))


def test_the_result_names_its_flags_and_the_budget_asked_for(kind: str, trials: Trials, tmp_path: Path) -> None:
    ran = trials.get(kind, "safe", tmp_path)
    r = ran.result
    assert r.flags == {**ran.scenario.engine.flags, **SAFE}
    at = r.argv.index("--max-num-batched-tokens")
    assert r.argv[at + 1] == "1024"
    assert r.engine["max_num_batched_tokens"] == SAFE["max-num-batched-tokens"]
    assert str(r.engine["version"]).startswith(VLLM_VERSION)


def test_a_trial_on_a_gpu_group_is_measured_on_that_group(request: pytest.FixtureRequest, kind: str,
                                                           trials: Trials, tmp_path: Path) -> None:
    """`gpus`: the trial's own GPU group when trials run side by side (TrialRunner.run)."""
    known_bug(request, kind, "sim-virtual", VIRTUAL_GPUS)
    r = trials.get(kind, "on-gpus-4-5", tmp_path).result
    assert r.outcome == Outcome.OK, r.reason
    assert r.memory["devices"] == [4, 5]


@pytest.mark.parametrize("case", ["safe", "over-threshold", "allocation-fails"])
def test_nothing_of_a_trial_outlives_run(kind: str, case: str, trials: Trials, tmp_path: Path) -> None:
    """Stopped gracefully or killed at the threshold: no engine left in the registry, no GPU memory held."""
    ran = trials.get(kind, case, tmp_path)
    assert ran.engines_left == []
    assert ran.gpu_bytes_left == [0] * ran.scenario.sim_gpu_count()


# --- the memory wall ------------------------------------------------------------------------------------


def test_crossing_the_oom_threshold_is_recorded_not_raised(kind: str, trials: Trials, tmp_path: Path) -> None:
    r = trials.get(kind, "over-threshold", tmp_path).result
    assert r.outcome == Outcome.OOM_THRESHOLD and not r.feasible
    assert "threshold" in (r.reason or "")
    fraction = r.memory["peak_fraction"]
    assert isinstance(fraction, float) and fraction >= THRESHOLD


def test_a_failed_allocation_is_an_oom_crash(kind: str, trials: Trials, tmp_path: Path) -> None:
    r = trials.get(kind, "allocation-fails", tmp_path).result
    assert r.outcome == Outcome.OOM_CRASH and not r.feasible
    assert (r.reason or "").startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_no_room_for_the_kv_cache_is_a_startup_failure_in_the_engines_words(kind: str, trials: Trials,
                                                                            tmp_path: Path) -> None:
    """The memory model learns the utilization floor from this phrase (tuner/memory_model.py)."""
    r = trials.get(kind, "no-kv-room", tmp_path).result
    assert r.outcome == Outcome.STARTUP_FAILED, r.reason
    assert "No available memory for the cache blocks" in (r.reason or "")
    assert r.metrics.get("completed") in (None, 0)


# --- flags the engine refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "words"), [
    ("budget-below-max-num-seqs", "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."),
    ("unknown-option", "error: unrecognized arguments: --no-such-option 1"),
    ("not-a-number", "error: argument --max-num-batched-tokens: invalid human_readable_int value: 'lots'"),
], ids=["budget-below-max-num-seqs", "unknown-option", "not-a-number"])
def test_invalid_flags_are_an_outcome_with_vllms_message(request: pytest.FixtureRequest, kind: str, case: str,
                                                         words: str, trials: Trials, tmp_path: Path) -> None:
    """Recorded, not raised: the sampler learns the rule; the reason is vLLM's line, without the pydantic
    decoration ("Value error, " and " [type=...]") that the log classifier strips."""
    r = trials.get(kind, case, tmp_path).result
    assert r.outcome == Outcome.INVALID_FLAGS and not r.feasible
    reason = r.reason or ""
    assert "\n" not in reason
    assert reason.endswith(words)
    assert "[type=" not in reason and not reason.startswith("Value error, ")


# --- the study key --------------------------------------------------------------------------------------


def test_study_key_is_stable(kind: str, tmp_path: Path) -> None:
    """Two runs of `tune` on one scenario must open the same study (resume), so the key is a pure function."""
    scenario = tiny_scenario(tmp_path, kind)
    runner = make_runner(scenario, tmp_path)
    first = runner.study_key()
    assert runner.study_key() == first
    assert make_runner(tiny_scenario(tmp_path, kind, "again"), tmp_path).study_key() == first
    assert len(first.gpu_inventory) == scenario.sim_gpu_count()
    assert first.model_fingerprint and first.engine_version and first.workload_fingerprint


def test_study_key_follows_the_workload_and_the_model_not_the_budget(kind: str, tmp_path: Path) -> None:
    base = make_runner(tiny_scenario(tmp_path, kind), tmp_path).study_key()
    more = make_runner(tiny_scenario(tmp_path, kind, "more", workload__requests__count=REQUESTS + 1),
                       tmp_path).study_key()
    assert more.workload_fingerprint != base.workload_fingerprint
    assert (more.model_fingerprint, more.gpu_inventory, more.engine_version) == \
        (base.model_fingerprint, base.gpu_inventory, base.engine_version)
    smaller = make_runner(tiny_scenario(tmp_path, kind, "7b", engine__model="llama-2-7b"), tmp_path).study_key()
    assert smaller.model_fingerprint != base.model_fingerprint
    longer = make_runner(tiny_scenario(tmp_path, kind, "longer", budget__trials=99), tmp_path).study_key()
    assert longer == base


# --- replays within one lifetime ---------------------------------------------------------------------------

def test_replays_of_a_safe_candidate_share_one_lifetime(kind: str, tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, kind, "replays")
    results = asyncio.run(make_runner(scenario, tmp_path).run_lifetime(dict(SAFE), 2))
    assert [r.outcome for r in results] == [Outcome.OK] * 2, [r.reason for r in results]
    assert all(r.metrics["completed"] == REQUESTS and r.metrics["failed"] == 0 for r in results)
    assert len({r.peak_fraction for r in results}) == 1 and results[0].peak_fraction is not None
    assert all(r.flags == results[0].flags for r in results)
    assert EngineRegistry().entries() == [] and not any(_gpu_bytes_settled(scenario))


def test_a_failing_lifetime_is_not_replayed(kind: str, tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, kind, "replays-over")
    results = asyncio.run(make_runner(scenario, tmp_path).run_lifetime(dict(OVER_THRESHOLD), 3))
    assert [r.outcome for r in results] == [Outcome.OOM_THRESHOLD]


def test_a_lifetime_then_serves_another_workload_whose_failure_is_its_own(kind: str, tmp_path: Path) -> None:
    """Confirmation's last run and the soak on one engine: short prompts, then prompts of 4000 tokens whose
    full steps cross the wall at a budget the short ones never fill."""
    short = tiny_scenario(tmp_path, kind, "short", workload__requests__prompt_tokens={"kind": "fixed", "value": 200})
    long = tiny_scenario(tmp_path, kind, "long", workload__requests__prompt_tokens={"kind": "fixed", "value": 4000})
    held = asyncio.run(make_runner(short, tmp_path).run_lifetime(dict(SAFE), 1, then=long))
    assert [r.outcome for r in held] == [Outcome.OK] * 2, [r.reason for r in held]
    assert all(r.metrics["completed"] == REQUESTS and r.metrics["failed"] == 0 for r in held)
    assert held[0].peak_fraction is not None and held[1].peak_fraction is not None
    assert held[0].peak_fraction <= held[1].peak_fraction  # the replays' peak is theirs, the soak's the lifetime's
    if kind == "sim":  # a process is sampled over time: the replays' timeline ends where the soak began
        ends = [max(t for t, _ in r.memory["timeline"]) for r in held]  # type: ignore[union-attr]
        assert ends[0] < ends[1]
    over = asyncio.run(make_runner(short, tmp_path).run_lifetime(dict(OVER_THRESHOLD), 1, then=long))
    assert [r.outcome for r in over] == [Outcome.OK, Outcome.OOM_THRESHOLD], [r.reason for r in over]
    assert over[0].peak_fraction is not None and over[0].peak_fraction < THRESHOLD <= (over[1].peak_fraction or 0)
    assert EngineRegistry().entries() == [] and not any(_gpu_bytes_settled(short))
