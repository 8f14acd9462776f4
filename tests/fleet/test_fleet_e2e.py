"""The fleet end to end (issue 27): real daemon processes on simulated boxes, one real PostgreSQL. One story, to keep
the suite's time: box a starts tuning for the group of a, b, c (simulated RTX 4090s) and is SIGKILLed mid-tune; b
takes the group's tune over from the database (a's lease ran out) with a's study; c canaries b's winner and adopts
it; a, restarted, gives its stale tune up and follows after the canary's healthy period; f, of the same group but
with another process holding 2 GiB of one of its GPUs, declines the winner and tunes for itself, warm-started from
the group's study. Box d has other GPUs (RTX 3090): it never adopts the group's winner but tunes its own group,
warm-started from the group's study; e, d's twin on which any new config dies at start (a box whose free memory is
not what its twin's is), fails the canary's own check: it keeps its config, and the rollout of d's group stops with
e's reason."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.fleet.status import fleet_status
from autotuner.store.db import Store
from tests.fleet.boxes import Box, make_box
from tests.support.daemon import INITIAL, tear_down
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def boxes() -> Iterator[list[Box]]:
    made: list[Box] = []
    yield made
    for box in made:
        tear_down(box)


@pytest.fixture
def strangers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Another user's processes on a box's simulated GPUs; stopped by PID at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def hold(box: Box, mib: int, strangers: list[subprocess.Popen[bytes]]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "autotuner", "sim", "hold", "--gpu", "0", "--mib", str(mib),
                             "--name", "someone-else"], stdout=subprocess.PIPE, env=box.env, start_new_session=True)
    strangers.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"holding")


def cycles_of(store: Store, box: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT trigger_kind, warm_start, state, outcome FROM at_daemon_cycles "
                                    f"WHERE deployment = 'prod@{box}' ORDER BY id").all()
    return [dict(r._mapping) for r in rows]


def groups(store: Store) -> dict[str, dict[str, Any]]:
    """Each group by the name of one of its boxes (a or d)."""
    doc = fleet_status(store.engine)
    return {min(b["box"] for b in g["boxes"]): g for g in doc["groups"] if g["boxes"]}


def group_of(store: Store, box: str) -> dict[str, Any] | None:
    doc = fleet_status(store.engine)
    return next((g for g in doc["groups"] if any(b["box"] == box for b in g["boxes"])), None)


def adoption(group: dict[str, Any] | None, box: str) -> str | None:
    if not group or not group["rollouts"]:
        return None
    return next((a["state"] for a in group["rollouts"][0]["adoptions"] if a["box"] == box), None)


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    store = Store(postgres_url)
    yield store
    store.engine.dispose()


def test_a_fleet_tunes_once_canaries_and_follows(postgres_url: str, store: Store, tmp_path: Path,
                                                 boxes: list[Box], strangers: list[subprocess.Popen[bytes]]) -> None:
    a = make_box(tmp_path / "a", "a", postgres_url)
    boxes.append(a)
    a.start_daemon()

    def tuning_a() -> bool:
        g = group_of(store, "a")
        return bool(g and g["tuner"] and g["tuner"]["box"] == "a" and g["tuner"]["study"])
    wait_for(tuning_a, 120, "a to claim the group's tune and start its study", interval=0.2)
    study_a = group_of(store, "a")["tuner"]["study"]  # type: ignore[index]
    os.killpg(a.daemon.pid, signal.SIGKILL)  # type: ignore[union-attr]
    a.daemon.wait(timeout=10)  # type: ignore[union-attr]

    b = make_box(tmp_path / "b", "b", postgres_url)
    d = make_box(tmp_path / "d", "d", postgres_url, gpu="rtx-3090")
    e = make_box(tmp_path / "e", "e", postgres_url, gpu="rtx-3090", break_args=["--gpu-memory-utilization", "0.3"])
    boxes += [b, d, e]
    for box in (b, d, e):
        box.start_daemon()

    # b takes the tune over once a's lease has run out, resuming a's study.
    def taken_over() -> dict[str, Any] | None:
        g = group_of(store, "a")
        tuner = g["tuner"] if g else None
        return tuner if tuner and tuner["box"] == "b" else None
    tuner = wait_for(taken_over, 120, "b to take the group's tune over", interval=0.2)
    assert tuner["taken_over_from"] == "a" and tuner["study"] == study_a
    c = make_box(tmp_path / "c", "c", postgres_url)
    f = make_box(tmp_path / "f", "f", postgres_url)
    boxes += [c, f]
    hold(f, 2048, strangers)
    c.start_daemon()
    f.start_daemon()

    # b publishes its verified winner; c, the only other live box of the group, is its canary.
    wait_for(lambda: adoption(group_of(store, "a"), "c") == "adopted", 300, "c to adopt b's winner", interval=0.5)
    group = group_of(store, "a")
    assert group is not None
    rollout = group["rollouts"][0]
    assert rollout["tuned_by"] == "b" and rollout["canary"] == "c" and rollout["study"] == study_a
    assert yaml.safe_load(c.config_file.read_text()) == rollout["flags"] != INITIAL
    assert c.running_config() == rollout["flags"] and c.production_healthy()
    status = c.status()["fleet"]  # each daemon's /status carries its group
    assert status["box"] == "c" and [g["rollouts"][0]["canary"] for g in status["groups"]] == ["c"]

    # a comes back: its interrupted tune is no longer the group's; it follows after the canary's period.
    a.start_daemon()
    wait_for(lambda: adoption(group_of(store, "a"), "a") == "adopted", 240, "a to follow the canary", interval=0.5)
    assert a.live_config() == rollout["flags"] and a.production_healthy()
    adoptions = group_of(store, "a")["rollouts"][0]["adoptions"]  # type: ignore[index]
    assert [x["box"] for x in adoptions if x["state"] == "adopted"] == ["b", "c", "a"]
    # f never adopted it: 2 GiB more of another's memory than b had; it tuned for itself from the group's study.
    declined = next(x for x in adoptions if x["box"] == "f")
    more = re.search(r"(\d+) MiB more than on b", declined["reason"] or "")
    assert declined["state"] == "retuned" and more and 1536 < int(more.group(1)) < 2560, declined
    assert rollout["foreign_mib"] is not None and rollout["foreign_mib"] < 256, rollout  # b: production's alone
    retune = cycles_of(store, "f")[0]
    assert retune["trigger_kind"] == "fleet-retune" and retune["warm_start"] == study_a, retune
    assert group_of(store, "a")["rollouts"][0]["state"] == "rolling"  # type: ignore[index]

    # d (other GPUs) tuned its own group, warm-started from the group's study, and never adopted b's winner.
    def d_published() -> dict[str, Any] | None:
        g = group_of(store, "d")
        return g if g and g["rollouts"] and g["rollouts"][0]["state"] == "halted" else None
    other = wait_for(d_published, 300, "d's rollout to reach e and stop there", interval=0.5)
    assert other["group"] != group["group"] and other["tuner"]["box"] == "d"
    with store.engine.connect() as conn:
        warm = conn.exec_driver_sql("SELECT warm_start FROM at_daemon_cycles WHERE deployment = 'prod@d' "
                                    "AND study_name IS NOT NULL").scalar()
    assert warm == study_a
    halted = other["rollouts"][0]
    assert halted["canary"] == "e" and halted["reason"].startswith("e: ") and "deploy failed" in halted["reason"]
    assert e.live_config() == INITIAL == e.running_config() and e.production_healthy()  # kept its config
    wait_for(lambda: cycles_of(store, "f")[0]["state"] == "done", 120, "f's own tune to end", interval=0.5)
    assert f.production_healthy() and adoption(group_of(store, "a"), "f") == "retuned"
    assert adoption(group_of(store, "a"), "d") is None

    # The same from the command line, with no daemon involved.
    out = subprocess.run([sys.executable, "-m", "autotuner", "fleet", "status", "--storage", postgres_url],
                         capture_output=True, text=True, timeout=60, env=a.env)
    assert out.returncode == 0, out.stderr
    assert "tuner: b (done" in out.stdout and "taken over from a" in out.stdout
    assert "(halted)" in out.stdout and "e: deploy failed" in out.stdout
