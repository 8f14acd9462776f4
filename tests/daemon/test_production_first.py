"""Production first (issue 22), end to end: a real daemon process, the simulator as production behind a
`command` target, another process taking simulated GPU memory, real SQLite. The operator's story: the box
was rebooted and production is not running when the daemon starts; later someone's job takes 6 GiB of GPU 0
and production crashes outside the maintenance window."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from autotuner.daemon.runtime import runtime
from autotuner.daemon.state import cycles, events
from tests.support.daemon import INITIAL
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


def _rows(root: Path, table: sa.Table, order: str = "id") -> list[dict]:
    engine = sa.create_engine(f"sqlite:///{root / 'autotuner.db'}")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(sa.text(order)))]
    engine.dispose()
    return rows


def _closed_window() -> str:
    """A daily window that opens in two hours: closed for the whole test."""
    start = datetime.now() + timedelta(hours=2)
    return f"{start:%H:%M}-{start + timedelta(hours=1):%H:%M}"


def test_production_down_at_start_then_crash_outside_the_window_with_foreign_memory(deployment) -> None:
    d = deployment(start=False, daemon={"window": _closed_window(),
                                        "triggers": {"poll_interval_s": 1, "workload_drift": None}})
    assert not d.production_healthy()
    t0 = time.time()
    d.start_daemon()
    # Production was down when the daemon started: it starts it on the live config, at once, window or not.
    wait_for(d.production_healthy, 60, "the daemon to start production")
    first_down = time.time() - t0
    assert d.running_config() == INITIAL
    wait_for(lambda: d.status()["reference"], 30, "production adopted as the reference")

    # Someone else's job takes 6 of GPU 0's 24 GiB: a restart at utilization 0.8 would no longer fit.
    hold = subprocess.Popen([sys.executable, "-m", "autotuner", "sim", "hold", "--gpu", "0", "--mib", "6000",
                             "--name", "someones-notebook"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        holders = Path(os.environ["AUTOTUNER_SIM_STATE_DIR"]) / "holders"
        wait_for(lambda: any(f"-{hold.pid}." in p.name for p in holders.glob("*")), 30, "the foreign holder")
        # Production crashes (outside the window: the re-tune must wait, production must not).
        os.killpg(int((d.root / "pid").read_text()), signal.SIGKILL)
        crashed = time.time()
        wait_for(lambda: not d.production_healthy(), 10, "production to be down")
        wait_for(d.production_healthy, 60, "production serving again")
        back = time.time()
        assert back - crashed < 30, "restored within seconds, not at the window"
        # It came back at a utilization that fits what the foreign process left, and the daemon says so.
        running = d.running_config()
        assert running["gpu-memory-utilization"] < INITIAL["gpu-memory-utilization"], running
        assert {k: v for k, v in running.items() if k != "gpu-memory-utilization"} == \
            {k: v for k, v in INITIAL.items() if k != "gpu-memory-utilization"}
        assert d.live_config() == running
        fitted = wait_for(lambda: [e for e in _rows(d.root, events) if e["kind"] == "fitted"], 10, "the fitted note")
        assert "another process holds the rest" in fitted[-1]["detail"]
        status = wait_for(lambda: (s := d.status())["production"]["up"] and s, 10, "the health task to see it up")
        assert status["production"]["alarm"] is None
        # Nothing was tuned outside the window (a re-tune, if any trigger asks for one, waits for it).
        assert all(c["state"] == "window" and not c["trials"] for c in _rows(d.root, cycles))
        # Downtime as production's own health showed it: unplanned, a few seconds, not 0 and not the window.
        rt = _rows(d.root, runtime, order="deployment")[0]
        assert back - crashed - 2 <= rt["downtime_unplanned_s"] <= first_down + back - crashed + 3, rt
        assert rt["downtime_planned_s"] == 0.0
        metrics = d.metrics()
        assert "autotuner_daemon_production_up 1.0" in metrics
        assert "autotuner_daemon_downtime_seconds_total" in metrics
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hold.pid, signal.SIGKILL)
        hold.wait(timeout=10)
    assert d.stop_daemon() == 0
    # `daemon status` without the daemon: it says the daemon is not running, and what production runs.
    out = subprocess.run([sys.executable, "-m", "autotuner", "daemon", "status", str(d.root / "daemon.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "daemon: NOT running" in out.stdout
    assert f"gpu-memory-utilization={running['gpu-memory-utilization']}" in out.stdout
    assert yaml.safe_load(d.config_file.read_text()) == running
