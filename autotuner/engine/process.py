"""One engine lifetime as a supervised process group: start it with an argv list in its own session,
pump its log to a file and an in-memory tail, wait until it serves (failing fast if it exits), and
stop the whole group with escalating signals, verifying nothing is left."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from autotuner.engine.classify import LogFacts
from autotuner.engine.registry import EngineRegistry, engine_processes, stop_processes
from autotuner.private_files import append_binary
from autotuner.proc_identity import clock, create_time

TAIL_LINES = 200


class EngineProcess:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        registry: EngineRegistry,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.registry = registry
        self.facts = LogFacts()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.ready = False
        self.stopping = False
        self.killed_at: float | None = None
        self._on_line = on_line
        self._proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._leader_create_time = 0.0
        self._members: dict[int, float] = {}  # pid -> create time, every process of ours seen
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._stop_offset: int | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def pid_or_none(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> None:
        # The engine writes its log straight to the file, not through a pipe to us: if the tuner dies,
        # the engine must not die of a broken pipe before the next run finds and stops it. 0600 in a 0700
        # directory: it quotes the engine's command line and whatever the engine prints.
        with append_binary(self.log_path) as log, self.registry.launching(self.env) as env:
            # Own session: the whole tree (API server, engine core, TP workers) shares one process group.
            self._proc = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                self._leader_create_time = create_time(self._proc.pid) or clock()
                self._members[self._proc.pid] = self._leader_create_time
                self.registry.add(self._proc.pid, self.argv[0], self._leader_create_time)
            except BaseException:
                # Not on record: nobody could ever stop it. Stop it now, then say why we could not go on.
                self._kill_unrecorded()
                raise
        try:
            self._pump = threading.Thread(target=self._follow_log, name="engine-log", daemon=True)
            self._pump.start()
        except BaseException:
            self._kill_unrecorded()
            raise

    def _kill_unrecorded(self) -> None:
        assert self._proc is not None
        self.mark_stopping()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        stop_processes(self.processes(), grace_s=0.0)
        self._closed.set()

    def processes(self) -> list[psutil.Process]:
        """The engine's live processes now (recorded ones, and its session's members)."""
        if self._proc is None:
            return []
        with self._lock:
            recorded = list(self._members.items())
        procs = engine_processes(self._proc.pid, self._leader_create_time, recorded)
        with self._lock:
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    self._members.setdefault(proc.pid, proc.create_time())
        return procs

    def record_members(self) -> None:
        """Put the engine's current processes on record, so a later run can stop exactly those."""
        if self._proc is not None and not self.stopping:  # once stopping, its entry is on its way out
            self.registry.record_members(self._proc.pid, self.processes())

    @property
    def known_pids(self) -> set[int]:
        """Every PID of this engine seen so far (alive or not): its GPU memory is ours, not foreign."""
        with self._lock:
            return set(self._members)

    @property
    def logged_pids(self) -> set[int]:
        """The PIDs the engine named in its log (a container's may be of its own PID namespace)."""
        with self._lock:
            return set(self.facts.pids)

    def _follow_log(self) -> None:
        """Tail the log file into memory and the classifier until the engine is gone and read out."""
        with open(self.log_path, "rb") as log:
            pending = b""
            offset = 0  # file offset where `pending` starts
            while True:
                chunk = log.read(65536)
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for raw in complete:
                        offset += len(raw) + 1
                        self._take(raw.decode("utf-8", "replace"), offset)
                    continue
                if self._closed.is_set():
                    break
                time.sleep(0.05)
            if pending:
                self._take(pending.decode("utf-8", "replace"), offset + len(pending))

    def _take(self, line: str, end_offset: int) -> None:
        with self._lock:
            self.tail.append(line)
            # What the engine wrote after we asked it to stop is shutdown noise, not a failure.
            self.facts.stopping = self._stop_offset is not None and end_offset > self._stop_offset
            self.facts.feed(line, self.ready)
        if self._on_line is not None:
            self._on_line(line)

    def mark_stopping(self) -> None:
        with self._lock:
            if not self.stopping:
                self.stopping = True
                try:
                    self._stop_offset = self.log_path.stat().st_size
                except OSError:
                    self._stop_offset = 0

    async def wait_ready(self, base_url: str, served_name: str, timeout_s: float,
                         headers: Mapping[str, str] | None = None) -> str | None:
        """None when ready; otherwise why not ("exited" or "timeout"). Ready = /health 200 and
        /v1/models lists the served name."""
        deadline = time.monotonic() + timeout_s
        # Loopback: never through a proxy from the environment (the engine itself keeps it).
        async with httpx.AsyncClient(timeout=2.0, headers=dict(headers or {}), trust_env=False) as http:
            while time.monotonic() < deadline:
                if self.returncode is not None:
                    return "exited"
                try:
                    health = await http.get(base_url + "/health")
                    if health.status_code == 200:
                        models = await http.get(base_url + "/v1/models")
                        ids = [m.get("id") for m in models.json().get("data", [])] \
                            if models.status_code == 200 else []
                        if served_name in ids:
                            with self._lock:
                                self.ready = True
                            return None
                except (httpx.TransportError, ValueError):
                    pass
                await asyncio.sleep(0.1)
        return "timeout"

    def kill_now(self) -> None:
        """SIGKILL the whole group at once (the OOM threshold tripped: no time for a graceful stop)."""
        self.mark_stopping()
        if self._proc is not None and self.killed_at is None:
            self.killed_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def stop(self, grace_s: float = 15.0) -> bool:
        """SIGTERM the leader, wait, SIGKILL the group, verify it is gone. True when nothing is left."""
        if self._proc is None:
            return True
        self.mark_stopping()
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
        gone = stop_processes(self.processes(), grace_s=0.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        # Children write after the leader exits: read the log to its end before closing it.
        self._closed.set()
        if self._pump is not None:
            self._pump.join(timeout=5)
        if gone:
            self.registry.remove(self._proc.pid, self.known_pids)
        return gone

    def log_tail(self, lines: int = 40) -> list[str]:
        with self._lock:
            return list(self.tail)[-lines:]
