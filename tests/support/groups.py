"""Test groups that must run one member at a time, and the proof that they did.

Real-vLLM tests each fill both CPUs, and the Docker tests share one private engine: under pytest-xdist
(`--dist loadgroup`) each group goes to one worker, where its members run one after another, while the
simulator's tests spread over the other workers. Every member records when it ran in a ledger that all
workers of the run share; a member whose run overlaps another member's of the same group fails at
teardown, naming both. So a grouping that xdist does not honour cannot pass unnoticed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

GROUPED_MARKS = ("vllm", "docker")  # marker name = group name; a test with both goes with vllm
LEDGER = pytest.StashKey[Path]()
_WORKER_INPUT = "autotuner_group_ledger"


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name"))


def assign_groups(items: list[pytest.Item]) -> None:
    for item in items:
        for name in GROUPED_MARKS:
            if item.get_closest_marker(name):
                item.add_marker(pytest.mark.xdist_group(name))
                break


class AppliedCheck:
    @pytest.hookimpl(trylast=True)  # after xdist's own hook has put the groups into the node ids
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Under --dist loadgroup every member's node id carries its group, or xdist did not apply the groups (as
        with pytest 9.2 and pytest-xdist 3.8, pytest-xdist#1386) and the run would mix them: stop at once."""
        if not getattr(config.option, "loadgroup", False):
            return
        lost = [item.nodeid for item in items if group_of(item) and not item.nodeid.endswith(f"@{group_of(item)}")]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup did not group {lost[0]} (and {len(lost) - 1} more): this "
                                    "pytest-xdist cannot set node ids on this pytest; install the versions "
                                    "pyproject.toml pins")


def configure_ledger(config: pytest.Config) -> None:
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and _WORKER_INPUT in worker_input:
        config.stash[LEDGER] = Path(worker_input[_WORKER_INPUT])
    else:  # the controller, or a run without xdist: a ledger of this run's own
        config.stash[LEDGER] = Path(tempfile.mkdtemp(prefix="autotuner-groups-")) / "ledger.jsonl"


def remove_ledger(config: pytest.Config) -> None:
    """The controller's ledger goes with its run (a worker's is the controller's)."""
    if getattr(config, "workerinput", None) is None and LEDGER in config.stash:
        shutil.rmtree(config.stash[LEDGER].parent, ignore_errors=True)


def hand_ledger_to(node: object) -> None:
    """xdist's pytest_configure_node: each worker writes the controller's ledger."""
    node.workerinput[_WORKER_INPUT] = str(node.config.stash[LEDGER])  # type: ignore[attr-defined]


def _record(ledger: Path, entry: dict[str, object]) -> None:
    line = (json.dumps(entry) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one short O_APPEND write: whole lines, whatever the other workers write
    finally:
        os.close(fd)


def runs_of(ledger: Path, group: str) -> dict[str, dict[str, float]]:
    runs: dict[str, dict[str, float]] = {}
    if not ledger.exists():
        return runs
    for line in ledger.read_text().splitlines():
        entry = json.loads(line)
        if entry["group"] == group:
            runs.setdefault(entry["test"], {})[entry["event"]] = entry["t"]
    return runs


def overlapping(runs: dict[str, dict[str, float]], test: str) -> list[str]:
    mine = runs[test]
    return sorted(other for other, run in runs.items() if other != test
                  and run["start"] < mine["end"] and run.get("end", float("inf")) > mine["start"])


def ledger_guard(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    group = group_of(request.node)
    if group is None:
        yield
        return
    ledger = request.config.stash[LEDGER]
    test, worker = request.node.nodeid, os.environ.get("PYTEST_XDIST_WORKER", "main")
    _record(ledger, {"group": group, "test": test, "worker": worker, "event": "start", "t": time.time()})
    yield
    _record(ledger, {"group": group, "test": test, "worker": worker, "event": "end", "t": time.time()})
    clash = overlapping(runs_of(ledger, group), test)
    if clash:
        raise AssertionError(f"group {group!r} ran two members at once: {test} overlapped {', '.join(clash)}; "
                             "run with --dist loadgroup (the group's members must share one worker)")
