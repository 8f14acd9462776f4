"""The daemon as an operator drives it (issue 22): `daemon plan` / `run --once --dry-run` before anything
runs, `approve: manual` with approve and reject, two triggers in one poll, a window that closes during
confirm, SIGTERM during deploy and during verify, SIGKILL during a rollback. Real daemon processes, the
simulator as production behind a `command` target (tests/support/daemon.py), real SQLite; tiny tunes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from autotuner.daemon.state import cycles, events
from autotuner.engine.ports import free_port
from tests.support.daemon import INITIAL, PRODCTL, SCENARIO, Deployment, daemon_cli
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


def _rows(root: Path, table: sa.Table) -> list[dict[str, Any]]:
    engine = sa.create_engine(f"sqlite:///{root / 'autotuner.db'}")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))]
    engine.dispose()
    return rows


def _path(root: Path, cycle_id: int | None = None) -> list[tuple[str | None, str | None]]:
    return [(e["from_state"], e["to_state"]) for e in _rows(root, events)
            if e["kind"] == "transition" and (cycle_id is None or e["cycle_id"] == cycle_id)]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- 1. plan / --dry-run: a target that cannot take production down, a scenario on production's GPUs ------

def _plan_files(root: Path, deploy: dict[str, Any]) -> Path:
    """A daemon config whose scenario runs the simulator as a process on the simulated box (`sim`, not
    `sim-virtual`: it needs production's GPUs), production nowhere yet."""
    root.mkdir()
    scenario = json.loads(json.dumps(SCENARIO))
    scenario["engine"]["kind"] = "sim"
    (root / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    (root / "config.yaml").write_text(yaml.safe_dump(INITIAL))
    config = {"scenario": "scenario.yaml", "storage": "autotuner.db",
              "production": {"endpoint": f"http://127.0.0.1:{free_port()}"},
              "deploy": {"kind": "file", "config_path": str(root / "config.yaml"), **deploy},
              "triggers": {"poll_interval_s": 1, "workload_drift": None}, "min_interval_s": 0}
    (root / "daemon.yaml").write_text(yaml.safe_dump(config))
    return root / "daemon.yaml"


def _cli(*args: str, timeout: float = 120) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-m", "autotuner", "daemon", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_plan_refuses_a_file_target_that_cannot_take_production_down_and_changes_nothing(tmp_path: Path) -> None:
    config = _plan_files(tmp_path / "file-only", {})
    before = _tree(config.parent)
    for argv in (["plan", str(config)], ["run", str(config), "--once", "--dry-run"]):
        out = _cli(*argv)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("error: "), out.stderr
        assert "deploy.stop" in errors[0] and "deploy.start" in errors[0], errors[0]
        assert "cannot take production down" in errors[0], errors[0]
        # What a cycle would do is printed before the refusal, and nothing was written: no database, no config.
        assert "tune: the tune needs production's GPUs" in out.stdout, out.stdout
        assert _tree(config.parent) == before, sorted(set(_tree(config.parent)) - set(before))
    assert not (config.parent / "autotuner.db").exists()

    ctl = [sys.executable, str(PRODCTL)]
    config = _plan_files(tmp_path / "stop-start", {"stop": [*ctl, "stop", str(tmp_path)],
                                                   "start": [*ctl, "start", str(tmp_path)]})
    before = _tree(config.parent)
    for argv in (["plan", str(config)], ["run", str(config), "--once", "--dry-run"]):
        out = _cli(*argv)
        assert out.returncode == 0, (argv, out.stdout, out.stderr)
        assert "the tune needs production's GPUs: production stops for it" in out.stdout, out.stdout
        assert out.stdout.strip().splitlines()[-1] == "a cycle can complete with this config"
        assert out.stderr.strip() == "", out.stderr
        assert _tree(config.parent) == before


# --- 2. approve: manual -----------------------------------------------------------------------------

def _manual(deployment: Any) -> Deployment:
    return deployment(daemon={"approve": "manual", "min_interval_s": 0,
                              "triggers": {"poll_interval_s": 1, "workload_drift": None}})


def _once(d: Deployment) -> None:
    out = daemon_cli(d, "run", str(d.root / "daemon.yaml"), "--once")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_manual_approval_parks_at_proposed_serving_the_old_config_then_deploys_once_approved(deployment) -> None:
    d = _manual(deployment)
    config = str(d.root / "daemon.yaml")
    t0 = time.monotonic()
    _once(d)  # nothing fired: a manual cycle, tuned, confirmed, and parked for a person
    [cycle] = _rows(d.root, cycles)
    assert cycle["state"] == "proposed" and cycle["trigger_kind"] == "manual", cycle
    candidate = json.loads(cycle["candidate_flags"])
    assert candidate != INITIAL
    assert ("confirm", "proposed") in _path(d.root)
    # Production kept serving its old config the whole time.
    assert d.production_healthy()
    assert d.live_config() == INITIAL == d.running_config()

    status = daemon_cli(d, "status", config)
    assert status.returncode == 0, status.stderr
    assert "cycle 1 in flight: proposed (trigger manual" in status.stdout, status.stdout
    # What is proposed, with its certificate, and how to decide: an operator sees what they approve.
    proposed = json.loads(cycle["candidate_flags"])
    assert f"proposed: trial {cycle['candidate_trial']}: " + " ".join(f"{k}={v}" for k, v in proposed.items()) \
        in status.stdout, status.stdout
    assert "autotuner certificate" in status.stdout and "autotuner daemon approve CONFIG 1" in status.stdout
    doc = json.loads(daemon_cli(d, "status", config, "--json").stdout)
    assert doc["cycle"]["state"] == "proposed" and doc["cycle"]["candidate_trial"] == cycle["candidate_trial"]
    assert doc["daemon"]["running"] is False  # --once exited: status says so, not "in flight" by a live daemon

    # Only a proposed cycle, once, and only one that exists.
    missing = daemon_cli(d, "approve", config, "7")
    assert missing.returncode == 2 and "cycle 7: no such cycle" in missing.stderr, missing.stderr
    ok = daemon_cli(d, "approve", config, "1", "--by", "ops")
    assert ok.returncode == 0 and "cycle 1: approved" in ok.stdout, ok.stdout + ok.stderr
    again = daemon_cli(d, "approve", config, "1")
    assert again.returncode == 2 and "already decided" in again.stderr, again.stderr
    assert d.live_config() == INITIAL, "approving writes nothing: the daemon acts on it"

    _once(d)  # resumes the approved cycle: deploy, verify; and starts no other
    rows = _rows(d.root, cycles)
    assert len(rows) == 1, [(r["id"], r["trigger_kind"], r["state"]) for r in rows]
    cycle = rows[0]
    assert cycle["state"] == "done" and cycle["outcome"] == "deployed", cycle
    assert ("proposed", "deploy") in _path(d.root) and ("verify", "done") in _path(d.root)
    approved = next(e for e in _rows(d.root, events) if e["from_state"] == "proposed")
    assert json.loads(approved["detail"])["approved_by"] == "ops"
    assert d.live_config() == candidate == d.running_config()
    assert d.production_healthy()
    done = daemon_cli(d, "approve", config, "1")
    assert done.returncode == 2 and "is done (deployed), not proposed" in done.stderr, done.stderr
    print(f"manual approval story: {time.monotonic() - t0:.1f} s")


def test_a_rejected_proposal_ends_the_cycle_and_is_never_proposed_again(deployment) -> None:
    d = _manual(deployment)
    config = str(d.root / "daemon.yaml")
    _once(d)
    [cycle] = _rows(d.root, cycles)
    assert cycle["state"] == "proposed", cycle
    rejected = json.loads(cycle["candidate_flags"])
    out = daemon_cli(d, "reject", config, "1", "--by", "ops")
    assert out.returncode == 0 and "cycle 1: rejected" in out.stdout, out.stdout + out.stderr

    _once(d)  # the daemon acts on the decision: the cycle ends, production untouched
    rows = _rows(d.root, cycles)
    assert len(rows) == 1
    assert rows[0]["state"] == "done" and rows[0]["outcome"] == "rejected", rows[0]
    assert "rejected by ops" in rows[0]["reason"]
    assert d.live_config() == INITIAL == d.running_config() and d.production_healthy()
    doc = json.loads(daemon_cli(d, "status", config, "--json").stdout)
    assert {"flags": rejected, "kind": "rejected"}.items() <= doc["refused"][0].items(), doc["refused"]

    # The next cycle tunes the same workload again (warm-started from the rejected one): whatever it finds,
    # the rejected config is not what it proposes.
    _once(d)
    second = _rows(d.root, cycles)[1]
    assert second["state"] in ("proposed", "done"), second
    if second["state"] == "proposed":
        assert json.loads(second["candidate_flags"]) != rejected
    else:
        assert "refused by production before (rejected" in second["reason"], second
        assert second["outcome"] == "restored"
    assert d.live_config() == INITIAL == d.running_config() and d.production_healthy()


# --- 4. two triggers in one poll ---------------------------------------------------------------------

def test_a_model_swap_and_a_due_schedule_in_the_same_poll_make_one_cycle_noting_both(deployment) -> None:
    d = deployment(daemon={"triggers": {"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "6s"}},
                           "min_interval_s": 3600})
    d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")
    assert d.stop_daemon() == 0
    assert _rows(d.root, cycles) == [], "stopped before the schedule was due"
    adopted = next(e["at"] for e in _rows(d.root, events) if e["kind"] == "adopted")
    # While the daemon is down a person swaps the model, and the weekly (here: 6 s) schedule comes due.
    d.swap_model("mistral-7b")
    time.sleep(max(0.0, adopted + 6.5 - time.time()))
    d.start_daemon()
    status = d.wait_cycle_done()

    [cycle] = _rows(d.root, cycles)
    assert cycle["trigger_kind"] == "model-swap" and cycle["outcome"] == "deployed", cycle
    triggers = [(json.loads(e["detail"])["kind"], json.loads(e["detail"])["action"], e["at"])
                for e in _rows(d.root, events) if e["kind"] == "trigger"]
    assert [(k, a) for k, a, _ in triggers[:2]] == [("model-swap", "cycle"), ("schedule", "with model-swap")], triggers
    assert abs(triggers[0][2] - triggers[1][2]) < 0.5, "both seen in the same poll"
    assert d.served_root() == "mistral-7b"
    assert d.live_config() == d.running_config() == status["deployed"]["flags"]
    # A virtual-time tune needs none of production's GPUs: no drain, and the only downtime production's own
    # health saw is the restart onto the winner.
    at = {(e["from_state"], e["to_state"]): e["at"] for e in _rows(d.root, events) if e["kind"] == "transition"}
    assert not any("drain" in step for step in at), at
    assert 0 < cycle["downtime_s"] <= at[("verify", "done")] - at[("confirm", "deploy")] + 1.5, cycle["downtime_s"]
    time.sleep(2.5)  # the schedule is due again now, inside min_interval_s: noted at most, no second cycle
    assert len(_rows(d.root, cycles)) == 1
    assert d.stop_daemon() == 0


# --- 5. a window that closes during confirm ----------------------------------------------------------

def test_a_window_closing_during_confirm_keeps_production_on_its_config(deployment) -> None:
    # SIGHUP brings a window that closes 10 s later and a schedule due at once. The tune is bounded by its
    # timeout (2 s, then the trial in flight), so it ends inside the window whatever this machine's pace; the
    # confirmation (2 candidates × 200 runs in virtual time; 2 × 40 once finished inside the window on an idle
    # box, and racing may drop one candidate after its first run: 200 runs at least) runs past the window's end.
    d = deployment(daemon={"min_interval_s": 3600, "tune": {"trials": 500, "timeout": "2s", "confirm": "2x200",
                                                            "soak": "20s"}})
    pid = (d.root / "pid").read_text()
    daemon = d.start_daemon()
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")
    opens = datetime.now() - timedelta(minutes=1)
    closes = (datetime.now() + timedelta(seconds=10)).replace(microsecond=0)  # the window's text holds seconds
    if closes.date() != opens.date():
        pytest.skip("too close to midnight for a same-day window")
    config = yaml.safe_load((d.root / "daemon.yaml").read_text())
    config.update(window=f"{opens:%H:%M:%S}-{closes:%H:%M:%S}",
                  triggers={"poll_interval_s": 1, "workload_drift": None, "schedule": {"every": "1s"}})
    (d.root / "daemon.yaml").write_text(yaml.safe_dump(config))
    daemon.send_signal(signal.SIGHUP)
    status = d.wait_cycle_done(timeout=200)

    [cycle] = _rows(d.root, cycles)
    at = {(e["from_state"], e["to_state"]): e["at"] for e in _rows(d.root, events) if e["kind"] == "transition"}
    assert ("window", "tune") in at and ("tune", "confirm") in at, at
    # The premise: the tune began and ended inside the window, and the window closed during confirm.
    assert at[("tune", "confirm")] < closes.timestamp(), "the tune ended inside the window"
    assert cycle["ended_at"] >= closes.timestamp(), (cycle["ended_at"], closes.timestamp())
    print(f"window story: tune {at[('tune', 'confirm')] - at[('window', 'tune')]:.1f} s, confirm until "
          f"{cycle['ended_at'] - at[('tune', 'confirm')]:.1f} s later; window closed "
          f"{closes.timestamp() - at[('tune', 'confirm')]:.1f} s into confirm")
    assert cycle["outcome"] == "restored", cycle
    assert "maintenance window closed before the rollout" in cycle["reason"], cycle["reason"]
    assert not any(step[1] in ("deploy", "drain") for step in at), "nothing deployed, production never stopped"
    # Production served its previous config throughout: the same process, the same file.
    assert (d.root / "pid").read_text() == pid
    assert d.live_config() == INITIAL == d.running_config()
    assert d.production_healthy()
    assert cycle["downtime_s"] == 0.0
    assert status["state"] == "idle"
    assert d.stop_daemon() == 0


# --- 6. signals during deploy, verify and rollback ------------------------------------------------------

def _scheduled(deployment: Any, **kwargs: Any) -> Deployment:
    return deployment(daemon={"triggers": {"poll_interval_s": 1, "workload_drift": None,
                                           "schedule": {"every": "2s"}}, "min_interval_s": 3600}, **kwargs)


def _state_is(d: Deployment, state: str) -> bool:
    return (d.status().get("cycle") or {}).get("state") == state


def _one_consistent_config(d: Deployment, allowed: list[dict[str, Any]]) -> None:
    live = d.live_config()
    assert live in allowed, live
    assert live == d.running_config(), "the file and what production was started with differ"
    assert d.production_healthy()
    procs = d.production_processes()
    assert len(procs) == 1, [p.cmdline() for p in procs]


def _status_after_exit(d: Deployment, live: dict[str, Any]) -> None:
    """What the operator sees next: the daemon stopped, production up on the live config, nothing in flight."""
    out = daemon_cli(d, "status", str(d.root / "daemon.yaml"))
    assert out.returncode == 0, out.stderr
    assert "daemon: NOT running" in out.stdout and "stopped " in out.stdout, out.stdout
    assert "production: up since" in out.stdout, out.stdout
    assert "in flight" not in out.stdout and "ALARM" not in out.stdout, out.stdout
    prefix = f"  live config {d.config_file}: "
    [line] = [x for x in out.stdout.splitlines() if x.startswith(prefix)]
    assert set(line.removeprefix(prefix).split()) == {f"{k}={v}" for k, v in live.items()}, line


def test_sigterm_during_deploy_finishes_the_rollout_then_exits_0(deployment) -> None:
    d = _scheduled(deployment)
    (d.root / "start_delay").write_text("3")  # a slow start: SIGTERM arrives inside it
    daemon = d.start_daemon()
    wait_for(lambda: _state_is(d, "deploy"), 120, "the cycle to reach deploy", interval=0.1)
    time.sleep(1.0)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=120) == 0, d.daemon_log()
    [cycle] = _rows(d.root, cycles)
    assert cycle["state"] == "done" and cycle["outcome"] == "deployed", cycle
    assert ("deploy", "verify") in _path(d.root) and ("verify", "done") in _path(d.root)
    _one_consistent_config(d, [json.loads(cycle["candidate_flags"])])
    _status_after_exit(d, json.loads(cycle["candidate_flags"]))


def test_sigterm_during_verify_finishes_it_then_exits_0(deployment) -> None:
    # Production at a tenth of the tests' usual pace: verifying it takes seconds, and SIGTERM lands inside.
    d = _scheduled(deployment, sim_args=["--sim-gpu", "rtx-4090", "--sim-speedup", "5", "--sim-noise", "0"])
    daemon = d.start_daemon()
    wait_for(lambda: _state_is(d, "verify"), 120, "the cycle to reach verify", interval=0.05)
    daemon.send_signal(signal.SIGTERM)
    signalled = time.time()
    assert daemon.wait(timeout=120) == 0, d.daemon_log()
    [cycle] = _rows(d.root, cycles)
    assert cycle["state"] == "done", cycle
    ended = next(e["at"] for e in _rows(d.root, events) if e["from_state"] == "verify")
    assert ended > signalled, "the signal came while verify ran"
    assert cycle["outcome"] in ("deployed", "rolled-back"), cycle
    candidate = json.loads(cycle["candidate_flags"])
    _one_consistent_config(d, [candidate] if cycle["outcome"] == "deployed" else [INITIAL])
    _status_after_exit(d, d.live_config())


def test_sigkill_during_rollback_is_resumed_and_production_ends_serving(deployment) -> None:
    # Any config but the one production runs dies at start on this box (too little memory), and starts are
    # slow: the daemon is killed while the rollback brings the previous config back.
    d = _scheduled(deployment)
    (d.root / "trusted.yaml").write_bytes(d.config_file.read_bytes())
    (d.root / "break_args.json").write_text(json.dumps(["--gpu-memory-utilization", "0.3"]))
    (d.root / "start_delay").write_text("3")
    daemon = d.start_daemon()
    wait_for(lambda: _state_is(d, "rollback"), 180, "the cycle to reach rollback", interval=0.1)
    time.sleep(1.0)
    os.killpg(daemon.pid, signal.SIGKILL)  # the daemon and its children, as systemd's KillMode=control-group
    daemon.wait(timeout=10)
    assert _rows(d.root, cycles)[0]["state"] == "rollback"

    d.start_daemon()
    status = d.wait_cycle_done()
    [cycle] = _rows(d.root, cycles)
    assert cycle["outcome"] == "rolled-back", cycle
    assert any(e["kind"] == "resumed" and json.loads(e["detail"])["state"] == "rollback"
               for e in _rows(d.root, events))
    _one_consistent_config(d, [INITIAL])
    assert status["refused"][0]["flags"] == json.loads(cycle["candidate_flags"])
    assert status["state"] == "idle" and status["production"]["alarm"] is None
    assert d.stop_daemon() == 0
