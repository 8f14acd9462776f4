"""Sample efficiency of the tuning loop against an oracle (printed, not asserted).

    .venv/bin/python benchmarks/sample_efficiency.py [--seeds 10] [--trials 8 12 20] [--jobs 2]

Every trial runs through `VirtualRunner` (the simulator's engine core in virtual time, deterministic,
sim noise 0). Three model/GPU pairs:
- quickstart: the seed's case, Llama-2-13B, TP 8 on 8x RTX 3090 (24 GB), long prompts, SLO TTFT p95 10 s;
- llama3-8b-4090: Llama-3-8B, TP 1 on one RTX 4090, mixed prompt lengths;
- offload-13b-4090: Llama-2-13B, TP 1 on one RTX 4090: 24.2 GiB of weights on a 24 GiB card, so it
  starts only with `cpu-offload-gb` > 0.

- oracle: a coarse grid over the tuner's space (10 log-spaced budgets x utilization every 0.03 x a
  few offloads), refined around its three best feasible points (budget x0.7..x1.4, utilization +-0.02,
  offload +-0.5), and raised to the best feasible point any method measured (so no method beats it by
  the grid's coarseness). Evaluations are cached in benchmarks/.cache/ by scenario and simulator
  digest.
- tuner: the real `Tuner` (memory model, wall probes, early stopping) with a fresh SQLite file per
  seed, one study of max(N) engine runs; the scores at smaller N are its first N engine runs (the
  sampler's startup count is that of the largest budget: a simplification that keeps the run short).
- random: Optuna's RandomSampler over the same distributions, no baseline; smaller N are prefixes.
- walk: vLLM auto_tune.sh's walk: utilization from the top down (0.97, 0.96, ... >= 0.90) with the
  largest budget until the engine starts, then the budgets ascending at that utilization, then
  utilization -0.05 steps. Offload 0. Deterministic (the same for every seed). The probe counts as a
  full run (auto_tune only starts the server there; generous to the walk).

Per pair, method and N (engine runs): median [min-max] over seeds of the best SLO-feasible output
throughput / the oracle's, the feasible hypervolume / the oracle's, and the share of engine runs that
hit OOM (oom-threshold or oom-crash). A pruned run counts as a run; an oom-predicted candidate is not
one (no engine). Then early stopping: the same seeds without pruning, engine seconds of workload per
study and the final quality, and the tuner's per-study `oom-predicted` and `pruned` counts.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import structlog
import yaml
from optuna.trial import TrialState

from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import Outcome
from autotuner.trials.scoring import constraints_of, feasible
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.space import build_space
from autotuner.tuner.study import Tuner
from autotuner.vllm import FlagValue

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
BUDGET = "max-num-batched-tokens"
UTIL = "gpu-memory-utilization"
OFFLOAD = "cpu-offload-gb"
OOM = (Outcome.OOM_THRESHOLD, Outcome.OOM_CRASH)


@dataclass(frozen=True)
class Point:
    outcome: str
    feasible: bool
    throughput: float | None
    ttft: float | None

    @property
    def oom(self) -> bool:
        return self.outcome in OOM


# --- cases ---------------------------------------------------------------------------------------

def quickstart() -> Scenario:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    return Scenario.model_validate({**data, "engine": {**data["engine"], "kind": "sim-virtual"}})


def llama3_8b_4090() -> Scenario:
    return Scenario.model_validate({
        "name": "llama3-8b-rtx4090",
        "engine": {"kind": "sim-virtual", "model": "llama-3-8b", "flags": {"max-model-len": 8192},
                   "sim": {"gpu": "rtx-4090", "gpus": 1}},
        "oom_threshold": {"fraction": 0.97},
        "workload": {"requests": {"count": 32,
                                  "prompt_tokens": {"kind": "lognormal", "median": 1500, "sigma": 0.9,
                                                    "min": 64, "max": 7000},
                                  "output_tokens": 128},
                     "arrivals": {"kind": "concurrency", "concurrency": 16}, "warmup_requests": 1, "seed": 1},
        "slos": {"ttft_p95_s": 10.0},
    })


def offload_13b_4090() -> Scenario:
    """24.2 GiB of fp16 weights on a 23.99 GiB card: nothing starts without offloading."""
    return Scenario.model_validate({
        "name": "offload-13b-rtx4090",
        "engine": {"kind": "sim-virtual", "model": "llama-2-13b", "flags": {"max-model-len": 4096},
                   "sim": {"gpu": "rtx-4090", "gpus": 1}},
        "oom_threshold": {"fraction": 0.97},
        "workload": {"requests": {"count": 16, "prompt_tokens": {"kind": "uniform", "low": 500, "high": 2500},
                                  "output_tokens": 64},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}, "warmup_requests": 1, "seed": 1},
        "slos": {"ttft_p95_s": 60.0},
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 256, "high": 16384, "log": True},
                         "gpu-memory-utilization": {"type": "float", "low": 0.80, "high": 0.95, "step": 0.01},
                         "cpu-offload-gb": {"type": "float", "low": 0.0, "high": 12.0, "step": 0.5}},
    })


CASES: dict[str, Callable[[], Scenario]] = {"quickstart": quickstart, "llama3-8b-4090": llama3_8b_4090,
                                            "offload-13b-4090": offload_13b_4090}


# --- evaluation and cache ------------------------------------------------------------------------

def key_of(flags: dict[str, FlagValue]) -> str:
    return f"{int(flags[BUDGET])}|{float(flags[UTIL]):.2f}|{float(flags[OFFLOAD]):.1f}"


def flags_of(key: str) -> dict[str, FlagValue]:
    b, u, o = key.split("|")
    return {BUDGET: int(b), UTIL: float(u), OFFLOAD: float(o)}


def point_of(result: Any, scenario: Scenario, objectives: list[str]) -> Point:
    """Feasible exactly as the Tuner decides it: all constraints <= 0 and both objectives measured."""
    values = [result.metrics.get(m) for m in objectives]
    ok = feasible(constraints_of(result, scenario)) and all(v is not None for v in values)
    return Point(result.outcome, ok, result.metrics.get("output_tokens_per_s"), result.metrics.get("ttft_p95_s"))


def digest_of(scenario: Scenario) -> str:
    """The scenario as evaluated, plus the simulator's and runner's code: a changed model invalidates."""
    h = hashlib.sha256(json.dumps(scenario.model_dump(mode="json"), sort_keys=True).encode())
    pkg = ROOT / "autotuner"
    for path in sorted([*(pkg / "sim").glob("*.py"), pkg / "tuner" / "runners.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class Evaluator:
    """`VirtualRunner.evaluate` (no pruning: full runs) memoised in a JSON file per scenario digest."""

    def __init__(self, case: str, scenario: Scenario) -> None:
        self.case = case
        self.scenario = scenario
        self.runner = VirtualRunner(scenario)
        self.objectives = [o.metric for o in scenario.objectives]
        self.path = CACHE_DIR / f"sample_efficiency-{case}-{digest_of(scenario)}.json"
        self.points: dict[str, Point] = {}
        if self.path.is_file():
            raw = json.loads(self.path.read_text())
            self.points = {k: Point(*v) for k, v in raw.items()}
        self.dirty = False

    def __call__(self, flags: dict[str, FlagValue]) -> Point:
        k = key_of(flags)
        if k not in self.points:
            self.points[k] = point_of(self.runner.evaluate(flags_of(k)), self.scenario, self.objectives)
            self.dirty = True
        return self.points[k]

    def many(self, keys: list[str], jobs: int) -> None:
        missing = [k for k in dict.fromkeys(keys) if k not in self.points]
        if not missing:
            return
        if jobs > 1 and len(missing) > 40:
            chunks = [missing[i::jobs] for i in range(jobs)]
            with ProcessPoolExecutor(jobs) as pool:
                for part in pool.map(_evaluate_chunk, [self.case] * jobs, chunks):
                    self.points.update({k: Point(*v) for k, v in part.items()})
        else:
            for k in missing:
                self(flags_of(k))
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({k: [p.outcome, p.feasible, p.throughput, p.ttft]
                                       for k, p in self.points.items()}))
            tmp.replace(self.path)
            self.dirty = False


def _evaluate_chunk(case: str, keys: list[str]) -> dict[str, list[Any]]:
    scenario = CASES[case]()
    runner = VirtualRunner(scenario)
    objectives = [o.metric for o in scenario.objectives]
    out = {}
    for k in keys:
        p = point_of(runner.evaluate(flags_of(k)), scenario, objectives)
        out[k] = [p.outcome, p.feasible, p.throughput, p.ttft]
    return out


# --- scores --------------------------------------------------------------------------------------

def hypervolume(points: Iterable[Point], slo: float) -> float:
    """Area dominated by the feasible points, throughput up and TTFT down, reference (0, slo)."""
    pts = sorted(((p.throughput, p.ttft) for p in points if p.feasible and p.throughput and p.ttft is not None
                  and p.ttft < slo), reverse=True)
    area, best_ttft = 0.0, slo
    for i, (x, y) in enumerate(pts):
        best_ttft = min(best_ttft, y)
        nxt = pts[i + 1][0] if i + 1 < len(pts) else 0.0
        area += (x - nxt) * (slo - best_ttft)
    return area


def best_throughput(points: Iterable[Point]) -> float:
    return max((p.throughput or 0.0 for p in points if p.feasible), default=0.0)


@dataclass
class Score:
    best: float
    hv: float
    oom: float


def score(points: list[Point], oracle_best: float, oracle_hv: float, slo: float) -> Score:
    return Score(best_throughput(points) / oracle_best, hypervolume(points, slo) / oracle_hv if oracle_hv else 0.0,
                 sum(p.oom for p in points) / max(1, len(points)))


# --- methods -------------------------------------------------------------------------------------

def _range(scenario: Scenario) -> tuple[Any, Any, Any]:
    d = build_space(scenario).distributions
    return d[BUDGET], d[UTIL], d[OFFLOAD]


def coarse_keys(scenario: Scenario) -> list[str]:
    b, u, o = _range(scenario)
    budgets = sorted({round(b.low * (b.high / b.low) ** (i / 9)) for i in range(10)})
    utils = sorted({round(min(u.high, u.low + 0.03 * i), 2) for i in range(int((u.high - u.low) / 0.03) + 2)})
    hi = float(o.high)
    offloads = sorted({0.0, 0.5, 1.0, 2.0, hi} | {round(x * hi / 8 * 2) / 2 for x in range(9)}) if hi > 2 \
        else [0.5 * i for i in range(int(hi / 0.5) + 1)]
    return [key_of({BUDGET: x, UTIL: y, OFFLOAD: z}) for x in budgets for y in utils for z in offloads]


def refine_keys(scenario: Scenario, best: list[str]) -> list[str]:
    b, u, o = _range(scenario)
    out = []
    for key in best:
        f = flags_of(key)
        for fb in (0.7, 0.85, 1.0, 1.18, 1.4):
            for du in (-0.02, -0.01, 0.0, 0.01, 0.02):
                for do in (-0.5, 0.0, 0.5):
                    out.append(key_of({BUDGET: int(min(b.high, max(b.low, round(float(f[BUDGET]) * fb)))),
                                       UTIL: round(min(u.high, max(u.low, float(f[UTIL]) + du)), 2),
                                       OFFLOAD: min(float(o.high), max(0.0, float(f[OFFLOAD]) + do))}))
    return out


@dataclass
class TunerRun:
    points: list[Point]  # engine runs, in order
    workload_s: float  # engine seconds of workload over the study
    predicted: int  # oom-predicted candidates (no engine)
    pruned: int


def run_tuner(case: str, seed: int, n: int, tmp: str, prune: bool = True) -> TunerRun:
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    scenario = CASES[case]()
    store = Store(f"sqlite:///{tmp}/{scenario.name}-s{seed}-n{n}-p{int(prune)}.db")
    tuner = Tuner(scenario, VirtualRunner(scenario), store, n_trials=n, timeout_s=None, seed=seed, prune=prune)
    asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    # What the budget counts: engine runs. Candidates rejected before launch (flag rules, the memory
    # model) cost no engine time and are not runs here.
    launched = [t for t in complete if t.user_attrs.get("launched", True)]
    points = [Point(str(t.user_attrs.get("outcome")), bool(t.user_attrs.get("feasible")),
                    t.user_attrs.get("metric:output_tokens_per_s"), t.user_attrs.get("metric:ttft_p95_s"))
              for t in launched]
    workload = sum(float(t.user_attrs.get("metric:duration_s") or 0.0) for t in launched)
    return TunerRun(points, workload, sum(t.user_attrs.get("outcome") == Outcome.OOM_PREDICTED for t in complete),
                    sum(t.user_attrs.get("outcome") == Outcome.PRUNED for t in complete))


def run_random(scenario: Scenario, ev: Evaluator, seed: int, n: int) -> list[Point]:
    space = build_space(scenario)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed),
                                directions=["maximize", "minimize"])
    points = []
    for _ in range(n):
        trial = study.ask(space.distributions)
        points.append(ev(space.to_flags(trial.params)))
        study.tell(trial, state=TrialState.FAIL)
    return points


def run_walk(scenario: Scenario, ev: Evaluator, n: int) -> list[Point]:
    b, u, _ = _range(scenario)
    budgets = [x for x in (256, 512, 1024, 2048, 4096, 8192, 16384) if b.low <= x <= b.high]
    points: list[Point] = []
    util = min(0.97, float(u.high))
    while util >= 0.90 - 1e-9 and len(points) < n:  # auto_tune: probe with the largest config
        p = ev({BUDGET: budgets[-1], UTIL: util, OFFLOAD: 0.0})
        points.append(p)
        if p.outcome not in (Outcome.STARTUP_FAILED, Outcome.INVALID_FLAGS):
            break
        util = round(util - 0.01, 2)
    probed = util
    while len(points) < n and util >= float(u.low) - 1e-9:
        for x in budgets:
            if len(points) >= n:
                break
            if util == probed and x == budgets[-1]:
                continue  # measured by the probe
            points.append(ev({BUDGET: x, UTIL: util, OFFLOAD: 0.0}))
        util = round(util - 0.05, 2)
    return points


# --- main ----------------------------------------------------------------------------------------

def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} [{min(values):5.3f}-{max(values):5.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, nargs="+", default=[8, 12, 20])
    parser.add_argument("--jobs", type=int, default=2, help="processes for the oracle and the tuner's seeds")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-prune-seeds", type=int, default=4,
                        help="seeds run again without early stopping, for the time it saves")
    parser.add_argument("--no-groups", action="store_true",
                        help="skip the GPU-groups figure (benchmarks/gpu_groups.py, about 2.5 minutes)")
    args = parser.parse_args()

    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    t_start = time.perf_counter()
    at: dict[str, dict[str, float]] = {}  # case -> headline figures
    seeds = list(range(args.seeds))
    n_max = max(args.trials)

    for case in args.cases:
        scenario = CASES[case]()
        slo = scenario.slos["ttft_p95_s"]
        ev = Evaluator(case, scenario)
        t0 = time.perf_counter()
        keys = coarse_keys(scenario)
        ev.many(keys, args.jobs)
        top = sorted((k for k in keys if ev.points[k].feasible), key=lambda k: -(ev.points[k].throughput or 0.0))[:3]
        keys += refine_keys(scenario, top)
        ev.many(keys, args.jobs)
        ev.save()
        t_oracle = time.perf_counter() - t0

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="sample-eff-") as tmp, ProcessPoolExecutor(args.jobs) as pool:
            tuned = list(pool.map(run_tuner, [case] * len(seeds), seeds, [n_max] * len(seeds), [tmp] * len(seeds)))
            plain_seeds = seeds[:args.no_prune_seeds]
            plain = list(pool.map(run_tuner, [case] * len(plain_seeds), plain_seeds, [n_max] * len(plain_seeds),
                                  [tmp] * len(plain_seeds), [False] * len(plain_seeds)))
        t_tuner = time.perf_counter() - t0
        randoms = [run_random(scenario, ev, seed, n_max) for seed in seeds]
        walk = run_walk(scenario, ev, n_max)
        ev.save()

        oracle = [ev.points[k] for k in keys]
        measured = [p for r in tuned + plain for p in r.points] + [p for r in randoms for p in r] + walk
        o_best = max(best_throughput(oracle), best_throughput(measured))
        o_hv = max(hypervolume(oracle, slo), hypervolume(oracle + measured, slo))
        best_key = max((k for k in keys if ev.points[k].feasible), key=lambda k: ev.points[k].throughput or 0.0,
                       default="none")
        share_oom = sum(p.oom for p in oracle) / len(oracle)
        share_ok = sum(p.feasible for p in oracle) / len(oracle)
        print(f"\n== {case}: {scenario.engine.model}, TP {scenario.tensor_parallel_size()}, "
              f"{scenario.sim_gpu()}; space {build_space(scenario).distributions[OFFLOAD]}")
        print(f"oracle: {len(set(keys))} grid points in {t_oracle:.1f} s; {100 * share_ok:.1f} % SLO-feasible, "
              f"{100 * share_oom:.1f} % OOM; best {o_best:.1f} tok/s (grid's best at {best_key} budget|util|offload; "
              f"{best_throughput(oracle):.1f}), HV {o_hv:.1f} (ref: 0 tok/s, {slo:g} s)")
        print(f"tuner: {len(seeds)} seeds x {n_max} runs (+{len(plain)} without pruning) in {t_tuner:.1f} s")

        runs = {"tuner": [r.points for r in tuned], "random": randoms, "walk": [walk] * len(seeds)}
        print(f"{'method':<7} {'runs':>5}  {'best feasible thr / oracle':<26}  {'feasible HV / oracle':<26}  "
              f"{'OOM share of runs':<26}  no feasible")
        figures = at.setdefault(case, {})
        for method, per_seed in runs.items():
            for n in args.trials:
                scores = [score(p[:n], o_best, o_hv, slo) for p in per_seed]
                none = sum(s.best == 0 for s in scores)
                print(f"{method:<7} {n:>5}  {fmt([s.best for s in scores]):<26}  {fmt([s.hv for s in scores]):<26}  "
                      f"{fmt([s.oom for s in scores]):<26}  {none}/{len(scores)}")
                figures[f"{method}@{n}"] = statistics.median(s.best for s in scores)
                if method == "tuner" and n == n_max:
                    figures["oom_share"] = statistics.median(s.oom for s in scores)
        beaten = [f"{n}" for n in args.trials
                  if figures[f"tuner@{n}"] < max(figures[f"random@{n}"], figures[f"walk@{n}"]) - 1e-9]
        print(f"tuner >= both peers at every N: {'yes' if not beaten else 'no, behind at N=' + ','.join(beaten)}; "
              f"per study: {statistics.median(r.predicted for r in tuned):.0f} oom-predicted, "
              f"{statistics.median(r.pruned for r in tuned):.0f} pruned (medians)")
        if plain:
            pairs = list(zip(tuned, plain, strict=False))
            saved = [1 - a.workload_s / b.workload_s for a, b in pairs if b.workload_s]
            q_on = [best_throughput(a.points) / o_best for a, _ in pairs]
            q_off = [best_throughput(b.points) / o_best for _, b in pairs]
            print(f"early stopping ({len(pairs)} seeds, {n_max} runs): workload engine-seconds per study "
                  f"{statistics.median(a.workload_s for a, _ in pairs):.0f} with pruning vs "
                  f"{statistics.median(b.workload_s for _, b in pairs):.0f} without (saved {fmt(saved)}); "
                  f"best thr / oracle {fmt(q_on)} vs {fmt(q_off)}")
        print("(median [min-max] over seeds; the walk is deterministic)")

    groups = math.nan
    if not args.no_groups:
        from gpu_groups import trials_per_hour_ratio  # benchmarks/ is on sys.path when run as a script

        groups = trials_per_hour_ratio(verbose=False)
    print(f"\ntotal run time {time.perf_counter() - t_start:.1f} s")
    if at:
        def pick(key: str, agg: Callable[[Iterable[float]], float]) -> float:
            values = [f[key] for f in at.values() if key in f]
            return agg(values) if values else math.nan

        print(f"tuner@12={pick('tuner@12', min):.3f} tuner@20={pick('tuner@20', min):.3f} "
              f"walk@20={pick('walk@20', max):.3f} random@20={pick('random@20', max):.3f} "
              f"oom_share={pick('oom_share', max):.3f} trials_per_hour_groups={groups:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
