"""The certificate names the foreign baseline its trial was measured beside."""

from __future__ import annotations

from autotuner.export.certificate import foreign_line
from autotuner.store.db import TrialRecord

MIB = 1 << 20


def record(foreign: list[dict[str, object]] | None) -> TrialRecord:
    memory = {"peak_bytes": [1], "foreign": foreign} if foreign is not None else {"peak_bytes": [1]}
    return TrialRecord(trial_number=3, kind="search", outcome="ok", reason=None, state="COMPLETE", flags={},
                       result={"memory": memory})


def test_the_baseline_is_a_condition_of_validity() -> None:
    line = foreign_line(record([
        {"index": 0, "bytes": 400 * MIB, "processes": [{"pid": 1234, "name": "Xorg", "bytes": 400 * MIB}],
         "unlisted": False},
        {"index": 1, "bytes": 0, "processes": [], "unlisted": False},
        {"index": 2, "bytes": 300 * MIB + 1, "processes": [], "unlisted": True},
    ]))
    assert line == ("valid while GPU 0 carries at most 400 MiB of other processes (Xorg pid 1234); "
                    "GPU 2 carries at most 301 MiB of other processes")


def test_no_foreign_memory_and_old_trials() -> None:
    assert foreign_line(record([{"index": 0, "bytes": 0, "processes": [], "unlisted": False}])) == \
        "valid while no other process holds memory on its GPUs (none did when it was measured)"
    assert foreign_line(record(None)) is None  # trials from before the baseline was recorded
