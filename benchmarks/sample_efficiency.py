"""Sample efficiency of the tuning loop against a dense-grid oracle (printed, not asserted).

    .venv/bin/python benchmarks/sample_efficiency.py [--seeds 10] [--trials 10 20 40] [--jobs 2]

Every trial runs through `VirtualRunner` (the simulator's engine core in virtual time, deterministic).
Two cases: the quickstart scenario switched to `sim-virtual` (Llama-2-13B, TP 8, 8x RTX 3090, SLO
ttft_p95_s <= 10 s) and Llama-3-8B on one RTX 4090 (max-model-len 8192, mixed prompt lengths).

- oracle: a dense grid over the tuner's space (24 log-spaced budgets 256..16384 x utilization every
  0.01 in 0.70..0.97 x offload every 0.5 GiB; the 8B case takes every 1.0 GiB above 4 GiB). Its
  evaluations are cached in benchmarks/.cache/ keyed by the scenario's digest and the simulator's
  source digest, so only the first run pays for them.
- tuner: the real `Tuner` (its `make_sampler`, baseline first, constraints, placeholders) with a fresh
  SQLite file per run, one study per trial budget (the sampler's startup count depends on it).
- random: Optuna's RandomSampler over the same distributions, no baseline; 10/20/40 are prefixes.
- grid: vLLM auto_tune.sh's walk: probe utilization from the top down (0.97, 0.96, ... >= 0.90) with
  the largest budget until the engine starts, then the budgets ascending at that utilization; for
  more trials the walk goes on at utilization -0.05 steps (auto_tune's outer max-num-seqs loop has no
  counterpart here). Offload 0. Deterministic, so identical for every seed. The probe is counted as a
  full trial (auto_tune only starts the server there; this is generous to the grid).

Per case, method and trial count: (a) median best SLO-feasible output throughput / the oracle's,
(b) median feasible hypervolume (throughput up, TTFT p95 down, reference (0, SLO limit)) / the
oracle's, (c) median share of trials that hit OOM (oom-threshold or oom-crash). The tuner and random
can land between grid points, so (a) and (b) may exceed 1.
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

from autotuner.engine import classify as oc
from autotuner.scenario import FlagValue, Scenario
from autotuner.store.db import Store
from autotuner.tuner.runner import VirtualRunner
from autotuner.tuner.space import build_space
from autotuner.tuner.study import Tuner, constraints_of, feasible

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
BUDGET = "max-num-batched-tokens"
UTIL = "gpu-memory-utilization"
OFFLOAD = "cpu-offload-gb"
OOM = (oc.OOM_THRESHOLD, oc.OOM_CRASH)
METHODS = ("tuner", "random", "grid")


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


CASES: dict[str, Callable[[], Scenario]] = {"quickstart": quickstart, "llama3-8b-4090": llama3_8b_4090}
# Above this offload (GiB) the oracle takes every 1.0 GiB instead of every 0.5 (8B case: 0..14.5 GiB).
OFFLOAD_DENSE_UP_TO = 4.0


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
    for path in sorted([*(pkg / "sim").glob("*.py"), pkg / "tuner" / "runner.py", pkg / "tuner" / "study.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class Evaluator:
    """`VirtualRunner.evaluate` memoised in a JSON file per scenario digest."""

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
        if jobs > 1 and len(missing) > 200:
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
    return Score(best_throughput(points) / oracle_best, hypervolume(points, slo) / oracle_hv,
                 sum(p.oom for p in points) / len(points))


# --- methods -------------------------------------------------------------------------------------

def oracle_keys(scenario: Scenario) -> list[str]:
    space = build_space(scenario)
    off = space.distributions[OFFLOAD]
    hi = float(getattr(off, "high", 0.0))
    budgets = sorted({round(256 * 64 ** (i / 23)) for i in range(24)})
    utils = [round(0.70 + 0.01 * i, 2) for i in range(28)]
    offloads = [0.5 * i for i in range(int(hi / 0.5 + 1e-9) + 1)]
    offloads = [o for o in offloads if o <= OFFLOAD_DENSE_UP_TO or o == hi or (o - OFFLOAD_DENSE_UP_TO) % 1.0 == 0]
    return [key_of({BUDGET: b, UTIL: u, OFFLOAD: o}) for b in budgets for u in utils for o in offloads]


def run_tuner(scenario: Scenario, seed: int, n: int, tmp: Path) -> list[Point]:
    store = Store(f"sqlite:///{tmp}/{scenario.name}-s{seed}-n{n}.db")
    tuner = Tuner(scenario, VirtualRunner(scenario), store, n_trials=n, timeout_s=None, seed=seed)
    asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    # What the budget counts: engine runs. Candidates the loop rejected before launch (flag rules, the
    # memory wall) cost no engine time and are not trials here.
    trials = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if t.user_attrs.get("launched", True)), key=lambda t: t.number)
    return [Point(str(t.user_attrs.get("outcome")), bool(t.user_attrs.get("feasible")),
                  t.user_attrs.get("metric:output_tokens_per_s"), t.user_attrs.get("metric:ttft_p95_s"))
            for t in trials]


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


def run_grid(ev: Evaluator, n: int) -> list[Point]:
    budgets = [256, 512, 1024, 2048, 4096, 8192, 16384]
    points: list[Point] = []
    util = 0.97
    while util >= 0.90 - 1e-9 and len(points) < n:  # auto_tune: probe with the largest config
        p = ev({BUDGET: budgets[-1], UTIL: util, OFFLOAD: 0.0})
        points.append(p)
        if p.outcome not in (oc.STARTUP_FAILED, oc.INVALID_FLAGS):
            break
        util = round(util - 0.01, 2)
    probed = util
    while len(points) < n and util >= 0.70 - 1e-9:
        for b in budgets:
            if len(points) >= n:
                break
            if util == probed and b == budgets[-1]:
                continue  # measured by the probe
            points.append(ev({BUDGET: b, UTIL: util, OFFLOAD: 0.0}))
        util = round(util - 0.05, 2)
    return points


# --- main ----------------------------------------------------------------------------------------

def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} [{min(values):5.3f}-{max(values):5.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--jobs", type=int, default=2, help="processes for the oracle's first evaluation")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()

    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    t_start = time.perf_counter()
    headline: dict[str, float] = {}
    seeds = list(range(args.seeds))

    for case in args.cases:
        scenario = CASES[case]()
        slo = scenario.slos["ttft_p95_s"]
        ev = Evaluator(case, scenario)
        t0 = time.perf_counter()
        keys = oracle_keys(scenario)
        cached = sum(k in ev.points for k in keys)
        ev.many(keys, args.jobs)
        ev.save()
        oracle = [ev.points[k] for k in keys]
        o_best, o_hv = best_throughput(oracle), hypervolume(oracle, slo)
        best_key = max((k for k in keys if ev.points[k].feasible), key=lambda k: ev.points[k].throughput or 0.0)
        share_oom = sum(p.oom for p in oracle) / len(oracle)
        share_ok = sum(p.feasible for p in oracle) / len(oracle)
        print(f"\n== {case}: {scenario.engine.model}, {build_space(scenario).distributions[OFFLOAD]}")
        print(f"oracle: {len(keys)} grid points ({cached} cached) in {time.perf_counter() - t0:.1f} s; "
              f"{100 * share_ok:.1f} % SLO-feasible, {100 * share_oom:.1f} % OOM; best {o_best:.1f} tok/s at "
              f"{best_key} (budget|util|offload), HV {o_hv:.1f} (ref: 0 tok/s, {slo:g} s)")

        runs: dict[str, dict[int, list[list[Point]]]] = {m: {n: [] for n in args.trials} for m in METHODS}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="sample-eff-") as tmp:
            for seed in seeds:
                for n in args.trials:
                    runs["tuner"][n].append(run_tuner(scenario, seed, n, Path(tmp)))
        t_tuner = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_max = max(args.trials)
        for seed in seeds:
            pts = run_random(scenario, ev, seed, n_max)
            for n in args.trials:
                runs["random"][n].append(pts[:n])
        grid = run_grid(ev, n_max)
        for n in args.trials:
            runs["grid"][n] = [grid[:n]] * len(seeds)
        ev.save()
        print(f"tuner: {len(seeds)} seeds x {args.trials} trials in {t_tuner:.1f} s; random+grid in "
              f"{time.perf_counter() - t0:.1f} s")

        print(f"{'method':<7} {'trials':>6}  {'best feasible thr / oracle':<26}  {'feasible HV / oracle':<26}  "
              f"{'OOM share':<26}  no feasible")
        for method in METHODS:
            for n in args.trials:
                scores = [score(p, o_best, o_hv, slo) for p in runs[method][n]]
                none = sum(s.best == 0 for s in scores)
                print(f"{method:<7} {n:>6}  {fmt([s.best for s in scores]):<26}  {fmt([s.hv for s in scores]):<26}  "
                      f"{fmt([s.oom for s in scores]):<26}  {none}/{len(scores)}")
                if case == "quickstart" and n == 20:
                    headline[method] = statistics.median(s.best for s in scores)
                    if method == "tuner":
                        headline["oom_share"] = statistics.median(s.oom for s in scores)
        print("(median [min-max] over seeds; grid is deterministic)")

    print(f"\ntotal run time {time.perf_counter() - t_start:.1f} s")
    if headline:
        print(f"tuner@20={headline.get('tuner', math.nan):.3f} random@20={headline.get('random', math.nan):.3f} "
              f"grid@20={headline.get('grid', math.nan):.3f} oom_share={headline.get('oom_share', math.nan):.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
