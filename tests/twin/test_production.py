"""The twin calibrated on production's own /metrics, with no engine run (twin/production.py): a simulator
process serves as production on a box that deviates from its preset, real requests arrive at a Poisson
rate, the watcher's probe reads /metrics twice, and the window between them calibrates the twin.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import optuna
from typer.testing import CliRunner

from autotuner.cli.app import app
from autotuner.store.db import Store
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner
from autotuner.twin.calibrate import Observation, calibrate
from autotuner.twin.params import PRIOR
from autotuner.twin.production import PRODUCTION, STUDY_ATTR, production_observation
from autotuner.watch.probe import probe
from autotuner.watch.served import ServedWindow, served_window
from autotuner.workload.client import StreamingClient, http_client
from autotuner.workload.replay import replay
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec
from tests.twin.test_twin import INVENTORY, box_file, flags, measure, scenario, the_twin

# Production's box: a slow 4090 (the twin starts from the preset and never reads this).
SLOW = {"compute_efficiency": 0.6, "bandwidth_efficiency": 0.8, "step_overhead_s": 0.006}
SPEEDUP = 20
SERVED_FLAGS = flags(2048, 0.9)


def serve_production(sim_server: Any, gpu: str, requests: int = 60) -> ServedWindow:
    """Production on `gpu` under `requests` Poisson arrivals at 1/s (engine time), each prompt its own
    (no shared prefix for the cache to find); the window between the probes before and after."""
    server = sim_server.start(["llama-2-7b", "--max-model-len", "4096", "--max-num-batched-tokens", "2048",
                               "--gpu-memory-utilization", "0.9", "--sim-gpu", gpu, "--sim-speedup", str(SPEEDUP)])
    rng = random.Random(1)
    reqs = [RequestSpec(f"r{i} " + " ".join(["word"] * rng.randint(500, 2500)), None, 48) for i in range(requests)]
    spec = WorkloadSpec(SyntheticRequests(requests, LengthDist("fixed", value=1), LengthDist("fixed", value=1)),
                        Arrivals("poisson", rate=1.0, time_scale=SPEEDUP), seed=2)

    async def run() -> ServedWindow | None:
        before = await probe(server.url)
        async with http_client() as http:
            result = await replay(spec, reqs, StreamingClient(http, server.url, "llama-2-7b"))
        assert all(r.ok for r in result.results)
        return served_window(before, await probe(server.url))

    window = asyncio.run(run())
    assert window is not None
    return window


def test_production_metrics_calibrate_the_twin_with_no_engine_run(sim_server, tmp_path: Path) -> None:
    gpu = box_file(tmp_path, **SLOW)
    window = serve_production(sim_server, gpu)
    # The window is what production served, in the engine's seconds (the simulator says it runs 20× fast).
    assert window.requests == 60 and window.speedup == SPEEDUP
    assert 0.7 < window.request_rate < 1.4
    assert window.prompt_tokens.mean is not None and 1300 < window.prompt_tokens.mean < 1800
    twin = the_twin(scenario("rtx-4090"))
    obs = production_observation(twin.scenario, window, SERVED_FLAGS)
    assert obs is not None and obs.kind == PRODUCTION
    assert set(obs.metrics) == {"ttft_p50_s", "tpot_p50_s"}  # not the throughput: the arrival rate's
    assert obs.workload is not None and obs.workload["arrivals"]["kind"] == "poisson"
    # A p50 read from a coarse bucket weighs less than one measured by a trial.
    assert obs.sigma_of("ttft_p50_s") > 0.10
    # Stored with a study and read back as it was.
    assert Observation.from_dict(obs.as_dict()) == obs

    cal = calibrate(twin, [obs])
    ce = cal.params.compute_efficiency
    assert ce.low <= SLOW["compute_efficiency"] <= ce.high and ce.high < 1.0  # the preset's 1.0 is ruled out
    assert cal.fits == ()  # production's window is no trial to score the twin on

    # A config production never ran, measured on the box itself: the calibrated twin predicts it.
    held_out = measure(scenario(gpu), flags(1024, 0.88), 9)

    def error(params: Any, metric: str) -> float:
        return abs(twin.predict(held_out.flags, params).metrics[metric] / held_out.metrics[metric] - 1)

    for metric in ("output_tokens_per_s", "ttft_p50_s"):
        assert error(PRIOR, metric) > 0.3
        assert error(cal.params, metric) < 0.5 * error(PRIOR, metric), metric


def first_finalist_error(study: optuna.Study) -> float:
    first = min((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("kind") == "twin"),
                key=lambda t: t.number)
    assert first.user_attrs.get("feasible"), first.user_attrs
    return abs(first.user_attrs["twin_predicted"] / first.user_attrs["metric:output_tokens_per_s"] - 1)


def test_a_daemon_study_starts_from_productions_window_and_shows_it(sim_server, tmp_path: Path) -> None:
    """The tuner is handed production's window (the daemon's cycle does so): it is stored with the study,
    the twin's first finalist is predicted far better with it than from the preset, and `autotuner twin`
    shows it beside the trials."""
    gpu = box_file(tmp_path, **SLOW)
    window = serve_production(sim_server, gpu, requests=40)
    sc = scenario(gpu, noise=0.03)
    obs = production_observation(sc, window, SERVED_FLAGS)
    assert obs is not None
    store = Store(f"sqlite:///{tmp_path}/daemon.db")
    tuner = Tuner(sc, VirtualRunner(sc), store, n_trials=3, seed=0, twin=True, twin_evidence=[obs])
    summary = asyncio.run(tuner.run())
    assert "calibrated on production's /metrics too (1 window)" in summary.twin
    study = optuna.load_study(study_name=tuner.study_name, storage=store.optuna_storage())
    assert [Observation.from_dict(o) for o in study.user_attrs[STUDY_ATTR]] == [obs]
    # The same study without production's window: its first finalist is predicted by the preset alone.
    blind = Store(f"sqlite:///{tmp_path}/blind.db")
    asyncio.run(Tuner(sc, VirtualRunner(sc), blind, n_trials=3, seed=0, twin=True).run())
    blind_study = optuna.load_study(study_name=tuner.study_name, storage=blind.optuna_storage())
    seen, unseen = first_finalist_error(study), first_finalist_error(blind_study)
    assert seen < 0.10 and seen < 0.5 * unseen, (seen, unseen)
    shown = CliRunner().invoke(app, ["twin", tuner.study_name, "--storage", store.url])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if PRODUCTION in line)
    assert row.split()[0] == "-"  # production's window is no trial number
    # A resumed study reads the window from the study, not from its caller.
    again = Tuner(sc, VirtualRunner(sc), store, study_name=tuner.study_name, n_trials=4, seed=0, twin=True)
    assert "production" in asyncio.run(again.run()).twin
    assert INVENTORY  # the twin is the preset's, as in test_twin.py
