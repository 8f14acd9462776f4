"""A machine-wide test resource (tests.support.machine) is started by its first holder and stopped by its last,
whatever order the holders (xdist workers, other runs) leave in; one left behind by a killed run is stopped
and started afresh. The holders here are real processes; the resource is a counter file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import json, sys, time
from pathlib import Path
from tests.support.machine import SharedResource

root, log, release = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

def start():
    with log.open("a") as f:
        f.write("start\\n")
    return {"n": len(log.read_text().splitlines())}

def stop(value):
    with log.open("a") as f:
        f.write(f"stop {value['n']}\\n")

with SharedResource("counter", root).hold(start, stop) as value:
    print(json.dumps(value), flush=True)
    while not release.exists():
        time.sleep(0.02)
"""


def holder(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    release = tmp_path / f"release-{name}"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "res"), str(tmp_path / "log"), str(release)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True)
    return proc, release


def events(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_first_holder_starts_it_and_the_last_one_stops_it(tmp_path: Path) -> None:
    first, release_first = holder(tmp_path, "a")
    assert first.stdout is not None and first.stdout.readline().strip() == '{"n": 1}'
    second, release_second = holder(tmp_path, "b")
    assert second.stdout is not None and second.stdout.readline().strip() == '{"n": 1}'  # the same one, reused
    release_first.touch()
    assert first.wait(timeout=30) == 0
    assert events(tmp_path) == ["start"]  # the first to leave does not stop it under the other
    release_second.touch()
    assert second.wait(timeout=30) == 0
    assert events(tmp_path) == ["start", "stop 1"]


def test_one_left_by_a_killed_holder_is_stopped_and_started_afresh(tmp_path: Path) -> None:
    killed, _ = holder(tmp_path, "a")
    assert killed.stdout is not None and killed.stdout.readline().strip() == '{"n": 1}'
    os.killpg(killed.pid, signal.SIGKILL)  # no teardown: the state still names it
    killed.wait(timeout=30)
    again, release = holder(tmp_path, "b")
    assert again.stdout is not None and again.stdout.readline().strip() == '{"n": 3}'
    assert events(tmp_path) == ["start", "stop 1", "start"]
    release.touch()
    assert again.wait(timeout=30) == 0
    assert events(tmp_path)[-1] == "stop 3"
