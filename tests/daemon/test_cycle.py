"""Acceptance of the daemon (issue 12), end to end: real daemon process, simulator as production behind a
`command` target, real SQLite. Tunes are tiny (6 trials in virtual time, confirm 2x2, 20 s soak)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml

from autotuner.daemon.state import cycles, events
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.study import Tuner
from tests.support.daemon import INITIAL, SCENARIO
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


def _rows(root: Path, table: sa.Table) -> list[dict]:
    engine = sa.create_engine(f"sqlite:///{root / 'autotuner.db'}")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))]
    engine.dispose()
    return rows


def test_model_swap_is_detected_retuned_warm_deployed_and_verified(deployment) -> None:
    d = deployment()
    # This deployment's last study: `autotuner tune` of the scenario, run before the daemon started.
    sc = Scenario.model_validate({**SCENARIO, "source": d.root / "scenario.yaml"})
    store = Store(str(d.root / "autotuner.db"))
    old = asyncio.run(Tuner(sc, VirtualRunner(sc), store, n_trials=4).run()).study_name
    store.engine.dispose()
    d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")
    assert d.status()["state"] == "idle"

    d.swap_model("mistral-7b")
    swapped = time.time()  # the new model serves from here
    status = d.wait_cycle_done()

    last = status["last_cycle"]
    assert last["trigger"] == "model-swap" and last["outcome"] == "deployed", last
    assert last["warm_start"] == old
    trigger = next(e for e in _rows(d.root, events) if e["kind"] == "trigger")
    assert trigger["at"] - swapped <= 1 + 2.0, "detected within the poll interval (1 s) and a probe"
    # Warm start through the twin (the default): the new model's twin keeps this box's calibration from the
    # old study (tests/tuner/test_study.py checks the prior) and its finalists are measured.
    new_study = last["study"]
    engine = sa.create_engine(f"sqlite:///{d.root / 'autotuner.db'}")
    with engine.connect() as conn:
        kinds = [r[0] for r in conn.execute(sa.text("SELECT kind FROM at_trials WHERE study_name = :s"),
                                            {"s": new_study})]
    engine.dispose()
    assert "twin" in kinds and "warm-start" not in kinds
    # Production runs the new model on the winner, and what runs is what the file says.
    assert d.served_root() == "mistral-7b"
    deployed = status["deployed"]["flags"]
    assert d.live_config() == deployed == d.running_config()
    assert deployed != INITIAL
    assert status["deployed"]["certificate"]["lines"][0].startswith("autotuner certificate")
    # The file the daemon wrote carries the certificate and the whole run hint, as `export` writes it.
    written = d.config_file.read_text()
    assert written.startswith("# autotuner certificate") and "\n# run: " in written and " --config THIS_FILE" in written
    # Verify's wall-clock figures, at the simulator's speed-up, put in the certificate's units.
    verified = status["deployed"]["verify"]
    assert "speed-up 50 converted to simulated" in verified["units"]
    figure = verified["figures"]["output_tokens_per_s"]
    assert figure["in_certificate_units"] == pytest.approx(figure["wall_clock"] / 50)
    # The reference follows production: no second swap fires.
    time.sleep(2.5)
    assert d.status()["counts"]["cycles"] == 1
    assert d.stop_daemon() == 0
    assert len(d.production_processes()) == 1
    # `daemon status` says the same from the database, with the daemon gone.
    out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "status", str(d.root / "daemon.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"deployed: trial {status['deployed']['trial']} of study {new_study}" in out.stdout
    assert "last cycle 1: deployed (trigger model-swap" in out.stdout


def test_candidate_production_refuses_is_rolled_back_and_never_deployed_again(deployment) -> None:
    # Production's box is not the tuning one: any config but the one it runs now starts on a box with
    # less free GPU memory, and dies there. Cycles come every second (backoff after failures: 2 s, 4 s).
    d = deployment(daemon={"triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "1s"}},
                           "min_interval_s": 1})
    (d.root / "trusted.yaml").write_bytes(d.config_file.read_bytes())
    (d.root / "break_args.json").write_text(json.dumps(["--gpu-memory-utilization", "0.3"]))
    d.start_daemon()
    status = d.wait_cycle_done()

    rows = _rows(d.root, cycles)
    assert len(rows) == 1
    cycle = rows[0]
    assert cycle["trigger_kind"] == "schedule"
    assert cycle["outcome"] == "rolled-back", cycle
    # The candidate's engine died at start: the deploy step sees it at once (not after a timeout).
    assert "deploy failed" in cycle["reason"] and "not running" in cycle["reason"], cycle["reason"]
    candidate = json.loads(cycle["candidate_flags"])
    assert candidate != INITIAL
    path = [(e["from_state"], e["to_state"]) for e in _rows(d.root, events) if e["kind"] == "transition"]
    assert ("deploy", "rollback") in path and ("rollback", "done") in path
    # Back on the previous config, serving.
    assert d.live_config() == INITIAL == d.running_config()
    assert d.production_healthy()
    assert status["counts"]["rollbacks"] == 1
    assert "autotuner_daemon_rollbacks_total 1.0" in d.metrics()
    assert status["refused"][0]["flags"] == candidate and status["refused"][0]["kind"] == "start"
    # Only /healthz without the token.
    base = f"http://127.0.0.1:{d.daemon_port}"
    assert httpx.get(base + "/status", trust_env=False).status_code == 401
    assert httpx.get(base + "/metrics", headers={"Authorization": "Bearer wrong"}, trust_env=False).status_code == 401
    assert httpx.get(base + "/healthz", trust_env=False).status_code == 200

    # The next cycle (after a 2 s backoff) tunes again, warm-started: whatever it finds, a config production
    # refused is never deployed again, and a refused winner is said so.
    wait_for(lambda: len([c for c in _rows(d.root, cycles) if c["state"] == "done"]) >= 2, 120, "a second cycle")
    rows = _rows(d.root, cycles)
    second = rows[1]
    assert second["started_at"] - rows[0]["ended_at"] >= 2.0 - 0.5, "backed off after the failed cycle"
    deployed = [json.loads(c["candidate_flags"]) for c in rows if c["candidate_flags"]
                and any(e["cycle_id"] == c["id"] and e["from_state"] == "deploy" for e in _rows(d.root, events))]
    assert len(deployed) == len({json.dumps(f, sort_keys=True) for f in deployed}), deployed
    if second["candidate_flags"] and json.loads(second["candidate_flags"]) == candidate:
        assert "refused by production before" in second["reason"] and second["outcome"] == "restored"
    assert d.live_config() == INITIAL and d.production_healthy()
    assert d.stop_daemon() == 0


def test_daemon_killed_mid_deploy_resumes_on_one_consistent_config(deployment) -> None:
    d = deployment(daemon={"triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "2s"}},
                           "min_interval_s": 3600})
    (d.root / "start_delay").write_text("3")  # a slow start: the daemon is killed inside it
    daemon = d.start_daemon()
    wait_for(lambda: (d.status().get("cycle") or {}).get("state") == "deploy", 120, "the cycle to reach deploy",
             interval=0.1)
    time.sleep(1.0)
    os.killpg(daemon.pid, signal.SIGKILL)  # the daemon and its children, as systemd's KillMode=control-group
    daemon.wait(timeout=10)
    assert _rows(d.root, cycles)[0]["state"] in ("deploy", "verify")
    # `daemon status` tells the truth about a killed daemon: not running, its cycle interrupted.
    out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "status", str(d.root / "daemon.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "daemon: NOT running" in out.stdout and "interrupted: the daemon is not running" in out.stdout, out.stdout

    d.start_daemon()
    status = d.wait_cycle_done()
    cycle = _rows(d.root, cycles)[0]
    assert cycle["outcome"] in ("deployed", "rolled-back"), cycle
    assert any(e["kind"] == "resumed" for e in _rows(d.root, events))
    # One consistent config: the file is old or new, never a mix, and production runs exactly it.
    live = d.live_config()
    assert live in (INITIAL, json.loads(cycle["candidate_flags"]))
    assert live == d.running_config()
    assert d.production_healthy()
    # No orphan: exactly one production process.
    procs = d.production_processes()
    assert len(procs) == 1, [p.cmdline() for p in procs]
    assert status["state"] == "idle"
    # A person edits the live file (and production serves on it): the daemon notices, adopts and says so.
    edited = {**live, "max-num-batched-tokens": 512}
    d.config_file.write_text(yaml.safe_dump(edited))
    note = wait_for(lambda: [e for e in _rows(d.root, events) if e["kind"] == "hand-edit"], 20, "the hand edit")
    assert json.loads(note[0]["detail"])["after"] == edited
    assert d.status()["production"]["live_config"]["flags"] == edited
    assert d.stop_daemon() == 0


def test_window_closing_mid_tune_puts_the_previous_config_back(deployment) -> None:
    # The sampler's search (no twin, which would converge first): a tune that lasts past the window.
    d = deployment(daemon={"tune": {"trials": 500, "timeout": "1h", "confirm": "2x2", "soak": "20s", "twin": False}})
    daemon = d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")
    # SIGHUP: the new config opens a window that closes in 20 s, and a schedule that is due at once.
    start, end = datetime.now() - timedelta(minutes=1), datetime.now() + timedelta(seconds=20)
    if end.date() != start.date():
        pytest.skip("too close to midnight for a same-day window")
    config = yaml.safe_load((d.root / "daemon.yaml").read_text())
    # A bad file on SIGHUP is logged and the running config kept.
    (d.root / "daemon.yaml").write_text(yaml.safe_dump({**config, "window": "soon"}))
    daemon.send_signal(signal.SIGHUP)
    wait_for(lambda: "daemon.reload_failed" in d.daemon_log(), 20, "the failed reload to be logged")
    assert d._healthy() and d.status()["state"] == "idle"
    config.update(window=f"{start:%H:%M:%S}-{end:%H:%M:%S}", min_interval_s=3600,
                  triggers={"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "1s"}})
    (d.root / "daemon.yaml").write_text(yaml.safe_dump(config))
    daemon.send_signal(signal.SIGHUP)
    wait_for(lambda: (d.status().get("cycle") or {}).get("state") == "tune", 20, "the tune to start", interval=0.2)
    status = d.wait_cycle_done(timeout=120)
    cycle = _rows(d.root, cycles)[0]
    assert cycle["outcome"] == "restored", cycle
    assert "window closed" in cycle["reason"]
    assert cycle["ended_at"] >= end.timestamp() - 1
    assert 0 < (cycle["trials"] or 0) < 500
    # The previous config is back up and serving.
    assert d.live_config() == INITIAL == d.running_config()
    r = httpx.post(d.endpoint + "/v1/completions", json={"model": "llama-2-7b", "prompt": "hello", "max_tokens": 4},
                   timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    assert status["state"] == "idle"
    assert d.stop_daemon() == 0


def _long_prompts(d, n: int, concurrency: int, seed: int) -> list[int]:
    """n completions of ~1900-token prompts, `concurrency` at a time; their HTTP statuses (0: no answer).
    Each seed its own prompts: a prompt seen before would be served from the prefix cache."""
    async def one(http: httpx.AsyncClient, i: int) -> int:
        prompt = [(7919 * seed + 7 * i + j) % 31000 + 100 for j in range(1850 + 10 * i)]
        try:
            r = await http.post(d.endpoint + "/v1/completions", json={
                "model": "llama-2-7b", "prompt": prompt, "max_tokens": 32, "ignore_eos": True})
            return r.status_code
        except httpx.HTTPError:
            return 0

    async def run() -> list[int]:
        async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
            out: list[int] = []
            for start in range(0, n, concurrency):
                out += await asyncio.gather(*(one(http, i) for i in range(start, min(n, start + concurrency))))
            return out
    return asyncio.run(run())


def test_production_oom_under_longer_prompts_is_retuned_for_them(deployment) -> None:
    # The scenario was written for short prompts; production's hand-made config has a large token budget that
    # survives them, and one long prompt at a time, but not four at once.
    scenario = json.loads(json.dumps(SCENARIO))
    scenario["workload"]["requests"]["prompt_tokens"] = {"kind": "uniform", "low": 100, "high": 600}
    scenario["workload"]["arrivals"]["concurrency"] = 4
    initial = {"max-model-len": 4096, "max-num-batched-tokens": 3072, "gpu-memory-utilization": 0.95}
    d = deployment(scenario=scenario, initial=initial)
    d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")

    assert _long_prompts(d, 4, 1, seed=1) == [200] * 4
    served = time.time()

    def polled_since() -> bool:  # a poll that began after those requests saw their lengths in /metrics
        at = d.status().get("last_poll_at")
        return at is not None and datetime.fromisoformat(at).timestamp() >= served + 1
    wait_for(polled_since, 30, "a poll after the long prompts")
    assert set(_long_prompts(d, 4, 4, seed=2)) != {200}, "the burst of long prompts should kill the deployed config"
    status = d.wait_cycle_done()

    cycle = _rows(d.root, cycles)[0]
    assert cycle["trigger_kind"] == "production-oom", cycle
    evidence = json.loads(cycle["evidence"])
    assert "CUDA out of memory" in " ".join(evidence["lines"])
    # The step that crashed, from the scheduler dump the engine logged before dying: the burst's prompts.
    crash = evidence["crash_prompts"]
    assert crash and all(1850 <= n <= 1900 for n in crash), crash
    changes = json.loads(cycle["scenario"])["changes"]
    prompts = changes["workload.requests.prompt_tokens"]
    assert prompts["high"] >= 1900, prompts  # tuned for the lengths production saw, not the scenario's 600
    assert sorted(changes["workload.requests.include_prompt_tokens"]) == sorted(crash)  # replayed in trials and soak
    # Production did not wait for the cycle: an emergency mitigation put it back at once with a smaller
    # token budget, and the config that OOMed is refused, never the rollback target (`.previous` included).
    kinds = [e["kind"] for e in _rows(d.root, events)]
    assert kinds.index("mitigation") < kinds.index("transition")
    mitigation = json.loads(next(e for e in _rows(d.root, events) if e["kind"] == "mitigation")["detail"])
    assert mitigation["mitigation"]["max-num-batched-tokens"] < initial["max-num-batched-tokens"], mitigation
    assert json.loads(cycle["previous_flags"]) == mitigation["mitigation"]
    assert [r["kind"] for r in status["refused"] if r["flags"] == initial] == ["oom"], status["refused"]
    previous = d.root / "config.yaml.previous"
    assert not previous.exists() or yaml.safe_load(previous.read_text()) != initial
    assert cycle["outcome"] == "deployed", cycle
    assert d.live_config() == d.running_config() == json.loads(cycle["candidate_flags"])
    # The new config survives the workload that killed the old one.
    ooms_before = d.root.joinpath("vllm.log").read_text().count("CUDA out of memory")
    assert _long_prompts(d, 8, 4, seed=3) == [200] * 8
    assert d.production_healthy()
    assert d.root.joinpath("vllm.log").read_text().count("CUDA out of memory") == ooms_before
    assert "autotuner_daemon_production_oom_events_total 1.0" in d.metrics()
    assert status["last_trigger"]["kind"] == "production-oom"
    assert d.stop_daemon() == 0


def test_sigterm_mid_tune_puts_the_previous_config_back_then_exits(deployment) -> None:
    d = deployment(daemon={"triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "1s"}},
                           "min_interval_s": 3600, "tune": {"trials": 500, "timeout": "1h", "confirm": "2x2",
                                                            "soak": "20s"}})
    daemon = d.start_daemon()
    wait_for(lambda: (d.status().get("cycle") or {}).get("state") == "tune", 60, "the tune to start", interval=0.2)
    # A virtual-time tune needs none of production's GPUs: production keeps serving through it (no drain).
    for _ in range(5):
        assert d.production_healthy()
        time.sleep(0.2)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=120) == 0
    cycle = _rows(d.root, cycles)[0]
    assert cycle["state"] == "done" and cycle["outcome"] == "restored", cycle
    assert "asked to stop" in cycle["reason"]
    assert cycle["downtime_s"] == 0.0, "production's own health never saw it down"
    path = [(e["from_state"], e["to_state"]) for e in _rows(d.root, events) if e["kind"] == "transition"]
    assert ("window", "tune") in path and not any("drain" in step for step in path)
    assert d.live_config() == INITIAL == d.running_config()
    assert d.production_healthy()
