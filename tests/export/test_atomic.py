"""All-or-nothing writes under termination signals: a process with no handler for SIGTERM or SIGHUP dies
without running `finally`, so the signal must wait until the temp file is renamed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The signal arrives at the worst moment: after the temp file is written, before it is renamed.
_CHILD = """
import os, signal, sys, threading, time
from pathlib import Path
from autotuner.export import atomic
sig = int(sys.argv[2])
signal.signal(sig, signal.SIG_DFL)  # a suite started under nohup hands its children SIGHUP ignored
# A library's worker thread: the kernel may hand a process-directed signal to it instead.
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
os.fsync = lambda fd: os.kill(os.getpid(), sig)
target = Path(sys.argv[1])
if sys.argv[3] == "file":
    atomic.write_text_atomic(target, "whole: file\\n")
else:
    with atomic.staged_dir(target) as stage:
        (stage / "report.md").write_text("whole report\\n")
        os.kill(os.getpid(), sig)
        (stage / "report.html").write_text("<p>whole report</p>\\n")
print("survived the signal")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_write_waits_for_the_rename(tmp_path: Path, sig: signal.Signals) -> None:
    target = tmp_path / "out" / "vllm.yaml"
    target.parent.mkdir()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(target), str(int(sig)), "file"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -sig, done.stderr  # the signal still ends the process, after the write
    assert "survived" not in done.stdout
    assert [p.name for p in target.parent.iterdir()] == ["vllm.yaml"]
    assert target.read_text() == "whole: file\n"


def test_a_signal_mid_report_leaves_the_whole_directory(tmp_path: Path) -> None:
    target = tmp_path / "report"
    done = subprocess.run([sys.executable, "-c", _CHILD, str(target), str(int(signal.SIGTERM)), "dir"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["report"]
    assert sorted(p.name for p in target.iterdir()) == ["report.html", "report.md"]


def test_the_signal_mask_is_restored_after_a_write(tmp_path: Path) -> None:
    from autotuner.export.atomic import write_text_atomic

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    write_text_atomic(tmp_path / "x.yaml", "a: 1\n")
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == handlers
