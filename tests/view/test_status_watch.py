"""`status STUDY --watch` in one process follows a study that another process runs."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent.parent


def test_watch_shows_a_trial_finished_by_another_process(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["kind"] = "sim-virtual"
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(yaml.safe_dump(data))
    db = str(tmp_path / "w.db")
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home"), "COLUMNS": "120"}
    watcher = subprocess.Popen([sys.executable, "-m", "autotuner", "status", "w1", "--watch", "--interval", "0.2",
                                "--storage", db], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        first = lines.get(timeout=60)
        assert first.startswith("waiting for study w1"), first
        tuned = subprocess.run([sys.executable, "-m", "autotuner", "tune", str(scenario), "--trials", "2",
                                "--storage", db, "--study", "w1", "--quiet", "--confirm", "0"], env=env,
                               capture_output=True, text=True,
                               timeout=300)
        assert tuned.returncode == 0, tuned.stderr[-2000:]
        seen: list[str] = []
        deadline = time.monotonic() + 60
        # A row is "# kind ..." with "*" before the number of a Pareto member.
        while not any(line.lstrip("* ").split()[:2] in (["1", "search"], ["1", "probe"], ["1", "twin"]) for line in seen
                      if line.split()):
            assert time.monotonic() < deadline, "the watcher never showed trial 1:\n" + "".join(seen)
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        text = "".join(seen)
        assert "2/" in text and "baseline" in text and "outcome" in text and "study w1" in text
        assert watcher.poll() is None  # it keeps following until interrupted
    finally:
        watcher.terminate()
        watcher.wait(timeout=30)
