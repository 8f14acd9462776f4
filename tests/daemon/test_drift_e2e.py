"""Drift end to end (issue 22, problems 5 and 6): production on an 8192-token context, tuned for prompts of
2000–4095 tokens, starts receiving prompts of 5500–7800 tokens through its OpenAI API. vLLM's prompt-length
histogram tops out at 5000 for that context, so the drift and the re-tune must read its +Inf bucket up to the
served context; after the re-tune deploys, neither the daemon's own verify prompts nor more of the traffic it
was tuned for may fire another cycle: the yardstick is what the cycle tuned for."""

from __future__ import annotations

import asyncio
import json
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
import sqlalchemy as sa

from autotuner.daemon.evidence import SERVED
from autotuner.daemon.state import cycles, events
from autotuner.twin.calibrate import Observation
from autotuner.twin.production import PRODUCTION, STUDY_ATTR
from autotuner.watch.served import ServedWindow
from tests.support.daemon import Deployment
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

MODEL = "llama-3-8b"  # an 8192-token context without VLLM_ALLOW_LONG_MAX_MODEL_LEN
SCENARIO: dict[str, Any] = {
    "name": "prod",
    "engine": {"kind": "sim-virtual", "model": MODEL, "flags": {"max-model-len": 8192},
               "sim": {"gpu": "rtx-4090", "noise": 0.0}, "startup_timeout_s": 60},
    # What `init` would have written: uniform up to half the context (p95 ≈ 3990).
    "workload": {"requests": {"count": 12, "prompt_tokens": {"kind": "uniform", "low": 2000, "high": 4095},
                              "output_tokens": 16},
                 "arrivals": {"kind": "concurrency", "concurrency": 4}, "warmup_requests": 0},
    "objectives": [{"metric": "output_tokens_per_s", "direction": "maximize"}],
}
INITIAL = {"max-model-len": 8192, "max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.9}
# min_requests is the batch's size: a poll in the middle of the batch (two prompts at a time, a poll a second)
# cannot fire on part of it, so the window the cycle read holds exactly the batch.
DRIFT = {"p95_ratio": 1.25, "window_s": 300, "min_requests": 24}
LONG_LOW, LONG_HIGH = 5500, 7800


def _rows(root: Path, table: sa.Table) -> list[dict[str, Any]]:
    engine = sa.create_engine(f"sqlite:///{root / 'autotuner.db'}")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))]
    engine.dispose()
    return rows


def _drift_triggers(root: Path, after: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in _rows(root, events) if e["kind"] == "trigger" and e["at"] > after
            and json.loads(e["detail"]).get("kind") == "workload-drift"]


def _long_traffic(d: Deployment, n: int, seed: int) -> list[int]:
    """n completions of 5500–7800-token prompts, two at a time, as token ids (each prompt its own ids: the
    prefix cache cannot shorten them); their lengths. Every one must be served."""
    rng = random.Random(seed)
    lengths = [rng.randint(LONG_LOW, LONG_HIGH) for _ in range(n)]

    async def one(http: httpx.AsyncClient, i: int) -> int:
        prompt = [(7919 * seed + 104729 * i + 31 * j) % 120000 + 100 for j in range(lengths[i])]
        r = await http.post(d.endpoint + "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True})
        return r.status_code

    async def run() -> list[int]:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as http:
            out: list[int] = []
            for start in range(0, n, 2):
                out += await asyncio.gather(*(one(http, i) for i in range(start, min(n, start + 2))))
            return out
    statuses = asyncio.run(run())
    assert statuses == [200] * n, statuses
    return lengths


def _polled_after(d: Deployment, at: float, polls: int = 1) -> None:
    """Until a poll that began `polls` poll intervals (1 s) after `at` has been made."""
    def seen() -> bool:
        last = d.status().get("last_poll_at")
        return last is not None and datetime.fromisoformat(last).timestamp() >= at + polls
    wait_for(seen, 30, f"{polls} polls after the traffic")


def test_long_prompts_on_an_8192_context_fire_drift_and_the_retune_replays_them(deployment) -> None:
    t0 = time.monotonic()
    d = deployment(scenario=SCENARIO, initial=INITIAL, model=MODEL,
                   daemon={"triggers": {"poll_interval_s": 1, "workload_drift": DRIFT}, "min_interval_s": 3600,
                           "tune": {"trials": 6, "timeout": "5m", "confirm": "2x2", "soak": "20s", "twin": True}})
    d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")
    _polled_after(d, time.time())  # a baseline of production's histogram before the traffic

    lengths = _long_traffic(d, 24, seed=1)
    d.wait_cycle_done(timeout=240)

    [cycle] = _rows(d.root, cycles)
    assert cycle["trigger_kind"] == "workload-drift", cycle
    # The re-tune replays prompts as long as production's, up to what the context holds (not capped at the
    # histogram's last finite bucket, 5000).
    prompts = json.loads(cycle["scenario"])["changes"]["workload.requests.prompt_tokens"]
    assert prompts["high"] >= max(lengths) - 100, prompts
    assert prompts["high"] <= 8192 - 16, prompts
    assert prompts["low"] > 4095, prompts
    # The +Inf bucket (above 5000) read up to the served context, not at 5000.
    evidence = json.loads(cycle["evidence"])
    assert evidence.get("max_model_len") == 8192, evidence
    assert evidence["p95_production"] > 5000 * 1.1, evidence
    assert evidence["ratio"] >= DRIFT["p95_ratio"], evidence
    assert evidence["requests"] == len(lengths), "the window holds exactly production's requests"
    # The twin started from what production served (no engine run): the window and the flags it ran.
    served = evidence[SERVED]
    assert served["flags"] == {k: v for k, v in INITIAL.items() if k != "max-model-len"}, served
    assert ServedWindow.from_dict(served["window"]).requests == len(lengths)
    study = optuna.load_study(study_name=cycle["study_name"], storage=f"sqlite:///{d.root / 'autotuner.db'}")
    [seen] = [Observation.from_dict(o) for o in study.user_attrs[STUDY_ATTR]]
    assert seen.kind == PRODUCTION and seen.workload is not None
    assert seen.workload["requests"]["prompt_tokens"]["low"] > 4095, seen.workload  # the long prompts it served
    assert set(seen.metrics) >= {"ttft_p50_s"}, seen.metrics
    assert cycle["outcome"] == "deployed", cycle
    assert d.live_config() == d.running_config() == json.loads(cycle["candidate_flags"])
    # The reference follows the deploy (written just after the cycle ends): the tuned scenario is the yardstick.
    wait_for(lambda: d.status()["reference"].get("study") == cycle["study_name"], 20, "the reference to follow")
    ended = cycle["ended_at"]

    # The daemon's own verify prompts (the tuned scenario's: up to ~8100 tokens) are not drift: a few polls
    # after the deploy, no trigger has fired and no second cycle started.
    _polled_after(d, ended, polls=4)
    assert _drift_triggers(d.root, after=ended) == []
    # More of the traffic it was tuned for is not drift either: the yardstick is now the tuned scenario.
    sent = time.time()
    more = _long_traffic(d, 24, seed=2)
    assert min(more) > 4095 * DRIFT["p95_ratio"]  # drift against the configured scenario, not the tuned one
    _polled_after(d, time.time(), polls=3)
    assert _drift_triggers(d.root, after=ended) == [], "drift measured against the scenario before the re-tune"
    assert len(_rows(d.root, cycles)) == 1
    assert d.status()["state"] == "idle"
    assert d.production_healthy()
    assert d.stop_daemon() == 0
    print(f"drift story: {time.monotonic() - t0:.1f} s (second batch {time.time() - sent:.1f} s)")
