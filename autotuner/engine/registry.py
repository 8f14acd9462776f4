"""Engines we started, on disk, so that a later run can stop the orphans of a crashed tuner — and
only those: an entry names a process group and the tuner that owned it; a group is ours to kill only
while its owner is dead and the group's processes are the ones we started (start times checked)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

HOME_ENV = "AUTOTUNER_HOME"
START_TIME_SLACK_S = 5.0


def autotuner_home() -> Path:
    value = os.environ.get(HOME_ENV)
    if value:
        return Path(value)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "autotuner"


@dataclass(frozen=True)
class EngineEntry:
    pgid: int
    leader_create_time: float
    owner_pid: int
    owner_create_time: float
    started_at: float
    argv0: str


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def group_members(pgid: int, not_before: float | None = None) -> list[int]:
    """Live (non-zombie) processes of a process group, optionally only those started since a time."""
    members = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        # psutil's start times rest on the boot time, in whole seconds: allow for that (and for a
        # loaded machine between the fork and our record of it).
        if not_before is not None and proc.info["create_time"] < not_before - START_TIME_SLACK_S:
            continue
        members.append(proc.pid)
    return members


class EngineRegistry:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or autotuner_home()) / "engines"

    def _path(self, pgid: int) -> Path:
        return self.root / f"{pgid}.json"

    def add(self, pgid: int, argv0: str) -> EngineEntry:
        self.root.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        entry = EngineEntry(pgid, _create_time(pgid) or time.time(), me, _create_time(me) or 0.0,
                            time.time(), argv0)
        tmp = self._path(pgid).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(entry)))
        os.replace(tmp, self._path(pgid))
        return entry

    def remove(self, pgid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(pgid).unlink()

    def entries(self) -> list[EngineEntry]:
        out = []
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob("*.json")):
            try:
                out.append(EngineEntry(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return out

    def reap_orphans(self, grace_s: float = 5.0) -> list[int]:
        """Stop every registered engine group whose owning tuner is gone. Returns the pgids stopped."""
        stopped = []
        for entry in self.entries():
            if _create_time(entry.owner_pid) == entry.owner_create_time:
                continue  # its tuner (maybe this one) is alive and owns it
            if group_members(entry.pgid, not_before=entry.started_at):
                kill_group(entry.pgid, entry.started_at, grace_s)
                stopped.append(entry.pgid)
            self.remove(entry.pgid)
        return stopped


def kill_group(pgid: int, started_at: float, grace_s: float) -> bool:
    """SIGTERM the group, SIGKILL what is left after `grace_s`, and verify that none of its
    processes (started since `started_at`) is left. True when the group is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid, not_before=started_at):
                return True
            time.sleep(0.05)
    return not group_members(pgid, not_before=started_at)
