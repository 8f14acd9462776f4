"""Twin-first search against today's tuner and auto_tune.sh's walk, on boxes that deviate from their
presets (printed, not asserted).

    .venv/bin/python benchmarks/twin_first.py [--seeds 5] [--runs 12] [--jobs 2] [--boxes ...]

Each box is a GPU description file (catalog.gpus.BoxDeviation) that makes the simulated card run unlike
its preset, the way a real box does: slower kernels, slower memory, a slower host, more non-torch
memory, a larger transient, and on one box an efficiency that falls with the step's tokens (a curve no
scalar fits). The twin always starts from the preset and learns the box from the trials; the box file is
the ground truth it is judged against.

- oracle: noise-free on the perturbed box, the dense grid of sample_efficiency.py (10 log budgets ×
  utilization every 0.03 × offloads) refined around its three best feasible points.
- safe oracle (printed beside, not in the last line): the best noise-free throughput among the
  configurations that started within the memory threshold in each of 10 noisy starts. The noise-free
  oracle can sit within the simulator's run-to-run transient jitter (0–384 MiB) of the wall, where most
  real starts run out of memory and confirmation refuses it; the scores are also printed against this.
- twin / tuner: the real `Tuner` with and without the twin, engine runs in virtual time with the
  simulator's 3 % run-to-run noise (a fresh noise stream per seed); one study of `--runs` engine runs,
  the scores at fewer runs are its first N. The pick at N is the best *measured* SLO-feasible run among
  the first N, scored by its noise-free throughput on the box / the oracle's (not its lucky draw).
- walk: vLLM's auto_tune.sh (utilization from the top down with the largest budget until it starts,
  then budgets ascending), noise-free: generous to it.
- OOM runs: launched engine runs that hit the memory wall, per study (at `--runs`).
- starts to a verified winner: the engine runs until the study's final pick was first measured (the
  twin: until it converged or its pick was measured), plus the engine runs of the trust phase as `tune`
  runs it (`confirm` of DEFAULT_TOP × DEFAULT_REPEATS with its references, racing, then the soaks),
  measured; `trust_unraced` is what confirmation would have cost without racing (every candidate
  measured DEFAULT_REPEATS times, a reference one fewer: its search run counts).
- prod (`--production`): the twin, started as the daemon starts it, with production's served window: a
  simulator process serving the box file as production (vLLM's defaults where they serve, else the first
  of a lower utilization, then some offload, that serves: what a person runs after an OOM), Poisson
  arrivals of the scenario's prompts at half that config's capacity (60 requests), read from its /metrics
  before and after (twin/production.py).
  `first_err`: the twin's first finalist's |predicted / measured - 1|, with and without the window.
- swap: the 4090 box's study of llama-3-8b, then mistral-7b on the same box, twin-first warm-started
  from the first study (its box calibration) against cold: engine runs to reach 0.97 of mistral's oracle.

Last line: the worst box's medians for twin and tuner, the best box's for the walk, then the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import structlog
import yaml
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support.sim: production as a process
from sample_efficiency import (
    CACHE_DIR,
    Evaluator,
    Point,
    coarse_keys,
    key_of,
    llama3_8b_4090,
    offload_13b_4090,
    quickstart,
    refine_keys,
    run_walk,
)

from autotuner.analysis.evidence import confirmations
from autotuner.analysis.selection import select
from autotuner.catalog.gpus import GPU_PRESETS
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import OOM_OUTCOMES
from autotuner.trials.scoring import DEFAULT_REPEATS, DEFAULT_REPLAYS, DEFAULT_TOP
from autotuner.trust.commands import ConfirmPlan, after_tune
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner
from autotuner.twin.calibrate import Observation

BOX_DIR = CACHE_DIR / "boxes"


@dataclass(frozen=True)
class Box:
    name: str
    preset: str
    deviation: dict[str, Any]
    scenario: Callable[[], Scenario]


def _variant(base: Callable[[], Scenario], name: str, **changes: Any) -> Scenario:
    """`base`'s scenario renamed, with top-level sections or `engine.` keys replaced."""
    data = base().model_dump(mode="json", exclude_none=True)
    data["name"] = name
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return Scenario.model_validate(data)


def _tp2_3090() -> Scenario:
    sc = quickstart()
    return _variant(quickstart, "llama2-13b-tp2-3090",
                    engine__flags={**sc.engine.flags, "tensor-parallel-size": 2},
                    engine__sim={**sc.engine.sim.model_dump(mode="json", exclude_none=True), "gpus": 2},
                    workload={**sc.workload.model_dump(mode="json", exclude_none=True),
                              "requests": {**sc.workload.requests.model_dump(mode="json", exclude_none=True),
                                           "count": 12},
                              "arrivals": {"kind": "concurrency", "concurrency": 4}},
                    slos={"ttft_p95_s": 20.0})


def _h100() -> Scenario:
    return _variant(llama3_8b_4090, "llama3-8b-h100", slos={"ttft_p95_s": 3.0})


def _mistral_4090() -> Scenario:
    return _variant(llama3_8b_4090, "mistral-7b-rtx4090", engine__model="mistral-7b")


BOXES: list[Box] = [
    Box("3090-tp8", "rtx-3090", {"compute_efficiency": 0.85, "bandwidth_efficiency": 0.9, "step_overhead_s": 0.005,
                                 "non_torch_gib": 0.4, "transient_scale": 1.3}, quickstart),
    Box("3090-tp2", "rtx-3090", {"bandwidth_efficiency": 0.85, "step_overhead_s": 0.006, "non_torch_gib": 0.3,
                                 "transient_scale": 0.8}, _tp2_3090),
    Box("4090-tp1", "rtx-4090", {"compute_efficiency": 0.8, "bandwidth_efficiency": 0.92, "non_torch_gib": 0.6,
                                 "transient_scale": 1.5}, llama3_8b_4090),
    Box("h100-tp1", "h100-80gb", {"compute_efficiency": 0.7, "bandwidth_efficiency": 0.8, "step_overhead_s": 0.004,
                                  "non_torch_gib": 1.0}, _h100),
    Box("4090-offload", "rtx-4090", {"compute_efficiency": 0.9, "non_torch_gib": 0.5, "transient_scale": 1.2},
        offload_13b_4090),
    Box("4090-curve", "rtx-4090", {"non_torch_gib": 0.3, "efficiency_by_tokens": [[64, 1.0], [512, 0.95],
                                                                                   [2048, 0.7], [8192, 0.45]]},
        llama3_8b_4090),
]
SWAP_BOX = Box("4090-swap", "rtx-4090", BOXES[2].deviation, _mistral_4090)


def box_file(box: Box) -> str:
    """The box's GPU description file, named by its content (the oracle's cache key follows it)."""
    p = GPU_PRESETS[box.preset]
    data = {"name": f"{box.preset}-box", "product_name": p.product_name, "memory_gib": p.memory_gib,
            "bandwidth_gbps": p.bandwidth_gbps, "fp16_tflops": p.fp16_tflops, "pcie_gbps": p.pcie_gbps,
            "nvlink_gbps": p.nvlink_gbps, **box.deviation}
    text = yaml.safe_dump(data, sort_keys=True)
    path = BOX_DIR / f"{box.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not path.is_file():
        BOX_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def on_box(box: Box, noise: float | None = None) -> Scenario:
    data = box.scenario().model_dump(mode="json", exclude_none=True)
    data["engine"]["sim"]["gpu"] = box_file(box)
    if noise is not None:
        data["engine"]["sim"]["noise"] = noise
    return Scenario.model_validate(data)


# --- one study -----------------------------------------------------------------------------------

@dataclass
class Study:
    keys: list[str]  # engine runs, in order (budget|util|offload)
    measured: list[Point]  # what each run measured (noisy)
    twin_ended: str  # "" or the summary's twin line
    converged_at: int | None  # engine runs when the twin said it was done
    trust_starts: int = 0  # engine runs of confirmation (raced) and soak
    trust_unraced: int = 0  # what they would have been with every configuration confirmed R times
    first_err: float | None = None  # the twin's first finalist: |predicted / measured - 1|
    verified: str | None = None  # the winner confirmed and soaked (what export certifies); None: nothing held up
    claimed: float | None = None  # the certificate's throughput for it: its confirmed mean


def _quiet() -> None:
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def run_study(box: Box, seed: int, runs: int, twin: bool, tmp: str, warm_from: Box | None = None,
              evidence: list[Observation] | None = None) -> Study:
    _quiet()
    storage = (f"sqlite:///{tmp}/{box.name}-s{seed}-t{int(twin)}-w{int(warm_from is not None)}"
               f"-p{int(bool(evidence))}.db")
    store = Store(storage)
    warm = None
    if warm_from is not None:
        first = on_box(warm_from)
        old = Tuner(first, VirtualRunner(first, first_run=10_000 * seed + 5_000), store, n_trials=8, seed=seed,
                    twin=True)
        asyncio.run(old.run())
        warm = old.study_name
    scenario = on_box(box)
    tuner = Tuner(scenario, VirtualRunner(scenario, first_run=10_000 * seed), store, n_trials=runs, seed=seed,
                  twin=twin, warm_start=warm, twin_evidence=evidence or ())
    summary = asyncio.run(tuner.run())
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    launched = [t for t in done if t.user_attrs.get("launched", True)]
    keys = [key_of(scenario_flags(t.params)) for t in launched]
    measured = [Point(str(t.user_attrs.get("outcome")), bool(t.user_attrs.get("feasible")),
                      t.user_attrs.get("metric:output_tokens_per_s"), t.user_attrs.get("metric:ttft_p95_s"))
                for t in launched]
    converged = len(launched) if summary.ended == "twin-converged" else None
    first = next((t for t in launched if t.user_attrs.get("kind") == "twin"), None)
    first_err = (abs(first.user_attrs["twin_predicted"] / first.user_attrs["metric:output_tokens_per_s"] - 1)
                 if first is not None and first.user_attrs.get("feasible")
                 and isinstance(first.user_attrs.get("twin_predicted"), float) else None)
    confirmed, soaked = asyncio.run(after_tune(
        scenario, store, tuner.study_name, tuner.runner,
        lambda sc: VirtualRunner(sc, first_run=10_000 * seed + 9_000),
        ConfirmPlan(DEFAULT_TOP, DEFAULT_REPEATS, DEFAULT_REPLAYS), 600.0))
    # A soak on the engine of the winner's last confirmation run starts none of its own.
    soaks = sum(not v.after_confirm for v in soaked.verdicts) if soaked is not None else 0
    raced = confirmed.lifetimes if confirmed is not None else 0
    # Without racing: R lifetimes a candidate, R − 1 one whose search run counts (a reference, or every
    # candidate when confirmation took all the search found feasible), and the last round for the best.
    unraced = 0
    if confirmed is not None:
        counted = set(getattr(confirmed, "counted", confirmed.references))  # (a tree before it: references)
        everyone = confirmed.candidates + confirmed.references
        unraced = (sum(DEFAULT_REPEATS - (n in counted) for n in everyone)
                   + (confirmed.confirmed_best in counted and DEFAULT_REPEATS > 1))
    # What export would certify (confirmed, soaked, offload verified), by confirmation's own policy.
    try:
        picked = select(storage, tuner.study_name, [], "knee")
    except UserInputError:  # nothing the search measured meets the SLOs
        picked = None
    # Read again: a backed-off configuration (trust/backoff.py) is a trial the trust phase added.
    rows = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    verified = (key_of(scenario_flags(rows[picked.chosen.trial_number].params))
                if picked is not None and picked.chosen is not None and not picked.missing
                and picked.chosen.trial_number in rows else None)
    claim = (confirmations(store.trials(tuner.study_name)).get(picked.chosen.trial_number)
             if picked is not None and picked.chosen is not None and verified else None)
    iv = claim.intervals.get("output_tokens_per_s") if claim is not None else None
    return Study(keys, measured, summary.twin, converged, raced + soaks, unraced + soaks, first_err, verified,
                 iv.mean if iv is not None else None)


def scenario_flags(params: dict[str, Any]) -> dict[str, Any]:
    return {"max-num-batched-tokens": params["max-num-batched-tokens"],
            "gpu-memory-utilization": params["gpu-memory-utilization"],
            "cpu-offload-gb": params.get("cpu-offload-gb", 0.0)}


def pick_at(study: Study, n: int) -> str | None:
    """The best measured SLO-feasible run among the first n (what the tuner would call best)."""
    runs = [(k, p) for k, p in zip(study.keys[:n], study.measured[:n], strict=True) if p.feasible and p.throughput]
    return max(runs, key=lambda kp: kp[1].throughput or 0.0)[0] if runs else None


def true_score(ev: Evaluator, key: str | None, oracle: float) -> float:
    if key is None:
        return 0.0
    p = ev(_flags(key))
    return (p.throughput or 0.0) / oracle if p.feasible else 0.0


def _flags(key: str) -> dict[str, Any]:
    b, u, o = key.split("|")
    return {"max-num-batched-tokens": int(b), "gpu-memory-utilization": float(u), "cpu-offload-gb": float(o)}


def oracle_of(box: Box, ev: Evaluator) -> tuple[float, str]:
    scenario = ev.scenario
    keys = coarse_keys(scenario)
    ev.many(keys, 1)
    top = sorted((k for k in keys if ev.points[k].feasible), key=lambda k: -(ev.points[k].throughput or 0.0))[:3]
    keys += refine_keys(scenario, top)
    ev.many(keys, 1)
    ev.save()
    best = max((k for k in keys if ev.points[k].feasible), key=lambda k: ev.points[k].throughput or 0.0)
    return ev.points[best].throughput or 0.0, best


SAFE_TOP, SAFE_STARTS = 12, 10


def safe_oracle(box: Box, ev: Evaluator) -> tuple[float, str, int]:
    """The best noise-free throughput among configurations that start within the memory threshold in
    every one of SAFE_STARTS noisy engine starts (the simulator's run-to-run transient jitter, 0–384 MiB
    at 3 % noise): the noise-free oracle may sit so close to the wall that most real starts of it run out
    of memory, and confirmation's peak bound refuses such a winner. Also how many of the noise-free
    top SAFE_TOP were unsafe."""
    feasible = sorted((k for k, p in ev.points.items() if p.feasible), key=lambda k: -(ev.points[k].throughput or 0.0))
    noisy = VirtualRunner(on_box(box), first_run=777_000)
    unsafe = 0
    for key in feasible[:SAFE_TOP]:
        if all(noisy.evaluate(_flags(key)).outcome not in OOM_OUTCOMES for _ in range(SAFE_STARTS)):
            return ev.points[key].throughput or 0.0, key, unsafe
        unsafe += 1
    return float("nan"), "", unsafe


def production(box: Box, tmp: str) -> list[Observation] | str:
    """Production's served window on the box (vLLM's defaults under half their capacity), as the daemon
    hands it to the cycle's twin; or why there is none."""
    from autotuner.backends.sim import sim_argv
    from autotuner.twin.production import production_observation
    from autotuner.vllm import flag_argv
    from autotuner.watch.probe import probe
    from autotuner.watch.served import served_window
    from autotuner.workload.client import StreamingClient, http_client
    from autotuner.workload.replay import replay
    from autotuner.workload.request_spec import RequestSpec
    from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec
    from tests.support.sim import start_sim

    exact = on_box(box, noise=0.0)
    # What production runs: vLLM's defaults where they serve, else what a person tries after an OOM (a
    # lower utilization, then some offload) until it serves.
    tries = [{}, *({"gpu-memory-utilization": u / 100} for u in range(85, 55, -5)),
             *({"cpu-offload-gb": float(g)} for g in range(2, 18, 2))]
    flags, capacity = None, None
    for attempt in tries:
        ran = VirtualRunner(exact).evaluate(attempt)
        if ran.outcome == "ok" and ran.metrics.get("requests_per_s"):
            flags, capacity = attempt, float(ran.metrics["requests_per_s"])
            break
    if flags is None or capacity is None:
        return "nothing a person would try serves on this box"
    speedup = 50.0
    served = on_box(box)
    served = served.model_copy(update={"engine": served.engine.model_copy(update={
        "flags": {**served.engine.flags, **flags}, "sim": served.engine.sim.model_copy(update={"speedup": speedup})})})
    args = [served.engine.model, *flag_argv(served.engine.flags), *sim_argv(served, speedup=True)]
    os.environ.update(served.engine.resolved_env())  # the scenario's engine environment (a long context)
    # Each box's production its own simulated GPUs: two jobs serve two boxes at once.
    os.environ["AUTOTUNER_SIM_STATE_DIR"] = str(Path(tmp) / f"sim-state-{box.name}")
    server = start_sim(args, Path(tmp) / f"prod-{box.name}.log", timeout=120)
    try:
        rng = __import__("random").Random(7)
        r = served.workload.requests
        prompts, outputs = LengthDist(**r.prompt_tokens.model_dump()), LengthDist(**r.output_tokens.model_dump())
        n = 60
        reqs = [RequestSpec(f"r{i} " + " ".join(["word"] * max(1, prompts.sample(rng) - 2)), None,
                            outputs.sample(rng)) for i in range(n)]
        spec = WorkloadSpec(SyntheticRequests(n, LengthDist("fixed", value=1), LengthDist("fixed", value=1)),
                            Arrivals("poisson", rate=0.5 * float(capacity), time_scale=speedup), seed=3)

        async def run() -> Any:
            before = await probe(server.url)
            async with http_client() as http:
                await replay(spec, reqs, StreamingClient(http, server.url, served.engine.model, ignore_eos=True))
            return served_window(before, await probe(server.url))

        window = asyncio.run(run())
    finally:
        server.kill_group()
    if window is None:
        return "no window (too few requests finished)"
    obs = production_observation(on_box(box), window, flags)
    return [obs] if obs is not None else "production served another model"


def _box_job(box: Box, seeds: list[int], runs: int, tmp: str, prod: bool = False) -> dict[str, Any]:
    _quiet()
    ev = Evaluator(f"twin-{box.name}", on_box(box, noise=0.0))
    oracle, best = oracle_of(box, ev)
    safe, safe_key, unsafe = safe_oracle(box, ev)
    out: dict[str, Any] = {"oracle": oracle, "oracle_key": best, "twin": [], "tuner": [], "safe": safe,
                           "safe_key": safe_key, "unsafe": unsafe}
    evidence = production(box, tmp) if prod else "not asked (--production)"
    methods = ("twin", "tuner") + (("prod",) if not isinstance(evidence, str) else ())
    out["prod_none"] = evidence if isinstance(evidence, str) else None
    out["prod"] = []
    for seed in seeds:
        for method in methods:
            t0 = time.perf_counter()
            s = run_study(box, seed, runs, method != "tuner", tmp,
                          evidence=evidence if method == "prod" and not isinstance(evidence, str) else None)
            out[method].append({"keys": s.keys, "measured": [(p.outcome, p.feasible, p.throughput, p.ttft)
                                                             for p in s.measured],
                                "twin": s.twin_ended, "converged_at": s.converged_at,
                                "trust": s.trust_starts, "trust_unraced": s.trust_unraced,
                                "first_err": s.first_err, "verified": s.verified, "claimed": s.claimed,
                                "wall_s": time.perf_counter() - t0})
    walk = run_walk(ev.scenario, ev, runs)
    out["walk"] = max(((p.throughput or 0.0) / oracle for p in walk if p.feasible), default=0.0)
    # Every pick scored noise-free (the evaluator caches).
    for method in methods:
        for rec in out[method]:
            s = Study(rec["keys"], [Point(*m) for m in rec["measured"]], rec["twin"], rec["converged_at"])
            rec["scores"] = {n: true_score(ev, pick_at(s, n), oracle) for n in range(1, runs + 1)}
            rec["ooms"] = sum(m[0] in OOM_OUTCOMES for m in rec["measured"])
            rec["verified_score"] = true_score(ev, rec["verified"], oracle) if rec["verified"] else None
            rec["claim_err"] = (abs(rec["claimed"] / (rec["verified_score"] * oracle) - 1)
                                if rec["verified_score"] and rec["claimed"] else None)
            final = pick_at(s, len(s.keys))
            first = s.keys.index(final) + 1 if final else len(s.keys)
            rec["search_starts"] = max(first, rec["converged_at"] or 0) if method != "tuner" else first
    ev.save()
    return out


def _swap_job(seeds: list[int], runs: int, tmp: str) -> dict[str, Any]:
    _quiet()
    ev = Evaluator(f"twin-{SWAP_BOX.name}", on_box(SWAP_BOX, noise=0.0))
    oracle, _ = oracle_of(SWAP_BOX, ev)
    out: dict[str, list[int]] = {"warm": [], "cold": []}
    for seed in seeds:
        for how in ("warm", "cold"):
            s = run_study(SWAP_BOX, seed, runs, True, tmp, warm_from=BOXES[2] if how == "warm" else None)
            reached = next((n for n in range(1, len(s.keys) + 1)
                            if true_score(ev, pick_at(s, n), oracle) >= 0.97), runs + 1)
            out[how].append(reached)
    ev.save()
    return out


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--boxes", nargs="+", default=[b.name for b in BOXES], choices=[b.name for b in BOXES])
    parser.add_argument("--no-swap", action="store_true")
    parser.add_argument("--production", action="store_true",
                        help="also the twin started from production's served window (the daemon's)")
    args = parser.parse_args()
    _quiet()
    t0 = time.perf_counter()
    seeds = list(range(args.seeds))
    boxes = [b for b in BOXES if b.name in args.boxes]
    at = (4, 6, 8, 12)
    with tempfile.TemporaryDirectory(prefix="twin-first-") as tmp, ProcessPoolExecutor(args.jobs) as pool:
        swap = None if args.no_swap else pool.submit(_swap_job, seeds, args.runs, tmp)
        results = dict(zip([b.name for b in boxes],
                           pool.map(_box_job, boxes, [seeds] * len(boxes), [args.runs] * len(boxes),
                                    [tmp] * len(boxes), [args.production] * len(boxes)), strict=True))
        swapped = swap.result() if swap is not None else None

    rows: dict[str, dict[str, float]] = {}
    for name, r in results.items():
        row: dict[str, float] = {}
        print(f"\n== {name}: oracle {r['oracle']:.1f} tok/s at {r['oracle_key']} (budget|util|offload); safe oracle "
              f"{r['safe']:.1f} at {r['safe_key']} ({r['unsafe']} better ones ran out of memory in a noisy start)")
        if args.production and r["prod_none"]:
            print(f"prod   none: {r['prod_none']}")
        for method in ("twin", "tuner", "prod"):
            recs = r[method]
            if not recs:
                continue
            for n in at:
                if n <= args.runs:
                    row[f"{method}@{n}"] = med([rec["scores"][min(n, len(rec["keys"]))] if rec["keys"] else 0.0
                                                for rec in recs])
            row[f"{method}_oom"] = med([rec["ooms"] for rec in recs])
            row[f"{method}_starts"] = med([rec["search_starts"] + rec["trust"] for rec in recs])
            row[f"{method}_trust"] = med([rec["trust"] for rec in recs])
            row[f"{method}_unraced"] = med([rec["trust_unraced"] for rec in recs])
            scores = " ".join(f"@{n}={row[f'{method}@{n}']:.3f}" for n in at if n <= args.runs)
            scores += " (of the safe oracle: " + " ".join(
                f"@{n}={row[f'{method}@{n}'] * r['oracle'] / r['safe']:.3f}" for n in at if n <= args.runs) + ")"
            print(f"{method:6s} {scores}  oom_runs={row[f'{method}_oom']:.1f} (mean "
                  f"{statistics.fmean(rec['ooms'] for rec in recs):.1f}, most {max(rec['ooms'] for rec in recs)})"
                  f"  starts_to_verified="
                  f"{row[f'{method}_starts']:.0f} (trust {row[f'{method}_trust']:.0f}, unraced "
                  f"{row[f'{method}_unraced']:.0f})  wall/study={med([x['wall_s'] for x in recs]):.0f}s")
            held = [rec["verified_score"] for rec in recs if rec["verified_score"] is not None]
            row[f"{method}_unverified"] = len(recs) - len(held)
            claims = [rec["claim_err"] for rec in recs if rec["claim_err"] is not None]
            print(f"       verified winner (confirmed, soaked and offload-checked: what export certifies): p50 "
                  f"{med(held) if held else float('nan'):.3f} of the oracle; none in {len(recs) - len(held)} of "
                  f"{len(recs)} studies; its certificate's throughput off the truth by p50 {med(claims):.1%} "
                  f"(most {max(claims, default=float('nan')):.1%})")
            if method != "tuner":
                errs = [rec["first_err"] for rec in recs if rec.get("first_err") is not None]
                row[f"{method}_first_err"] = med(errs)
                print(f"       first finalist's error p50 {row[f'{method}_first_err']:.3f}")
                for rec in recs:
                    print(f"       {rec['twin']}")
        row["walk@12"] = r["walk"]
        print(f"walk   @{args.runs}={r['walk']:.3f}")
        rows[name] = row

    def worst(key: str) -> float:
        return min(row.get(key, float("nan")) for row in rows.values())

    best_walk = max(row["walk@12"] for row in rows.values())
    swap_warm = med(swapped["warm"]) if swapped else float("nan")
    if swapped:
        print(f"\n== swap llama-3-8b → mistral-7b on {SWAP_BOX.name}: runs to 0.97 of the new oracle, warm "
              f"{swapped['warm']} cold {swapped['cold']} (median {swap_warm:g} vs {med(swapped['cold']):g})")
    print("\nper box: " + "; ".join(f"{n} twin@6={r['twin@6']:.3f} tuner@6={r['tuner@6']:.3f}"
                                     for n, r in rows.items()))
    print(f"total {time.perf_counter() - t0:.0f} s, {args.seeds} seeds x {len(rows)} boxes, {args.runs} runs")
    prod_rows = {n: r for n, r in rows.items() if "prod@4" in r}
    if prod_rows:
        print("production window: " + "; ".join(
            f"{n} prod@4={r['prod@4']:.3f} twin@4={r['twin@4']:.3f} first_err {r['prod_first_err']:.3f} vs "
            f"{r['twin_first_err']:.3f} starts {r['prod_starts']:.0f} vs {r['twin_starts']:.0f}"
            for n, r in prod_rows.items()))
    print(f"twin@4={worst('twin@4'):.3f} twin@6={worst('twin@6'):.3f} tuner@6={worst('tuner@6'):.3f} "
          f"twin@12={worst('twin@12'):.3f} tuner@12={worst('tuner@12'):.3f} walk@12={best_walk:.3f} "
          f"oom_runs_per_study={max(r['twin_oom'] for r in rows.values()):.1f} "
          f"starts_to_verified={max(r['twin_starts'] for r in rows.values()):.0f} "
          f"starts_to_verified_today={max(r['tuner_starts'] for r in rows.values()):.0f} "
          f"swap_runs_to_097={swap_warm:g} twin_err_p50={twin_error(results):.3f}")


def twin_error(results: dict[str, Any]) -> float:
    """The median over studies of the twin's finalists' error p50, read from its summary line."""
    errs = []
    for r in results.values():
        for rec in r["twin"]:
            line = rec["twin"]
            if "error p50 " in line:
                errs.append(float(line.split("error p50 ")[1].split("%")[0]) / 100)
    return med(errs)


if __name__ == "__main__":
    main()
