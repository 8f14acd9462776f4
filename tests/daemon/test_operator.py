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
