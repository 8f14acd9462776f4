"""The simulated server's side of its TP workers: spawn them, tell them what to hold, stop them.

Workers stay in the caller's process group (no new session): the engine supervisor stops a trial by
signalling the whole group, and that must reach the workers exactly as it reaches vLLM's. If the
server alone is SIGKILLed, the workers see EOF on stdin and live on as orphans holding their
memory, as vLLM's do (see ``autotuner.sim.worker_process``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import autotuner
from autotuner.errors import AutotunerError

WORKER_NAME_PREFIX = "VLLM::Worker_TP"


class SimWorkerError(AutotunerError):
    """A simulated worker died, refused a request or did not answer in time."""


class WorkerPool:
    """One simulated worker process per tensor-parallel rank; rank r holds memory on gpu_indices[r]."""

    def __init__(self, state_dir: Path, gpu_indices: list[int]) -> None:
        self.state_dir = Path(state_dir)
        self.gpu_indices = list(gpu_indices)
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> None:
        if self._procs:
            raise RuntimeError("WorkerPool already started")
        env = dict(os.environ)
        # The workers import this package; make that work whatever the caller's cwd is.
        package_root = str(Path(autotuner.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            for rank, gpu in enumerate(self.gpu_indices):
                argv = [
                    sys.executable, "-m", "autotuner.sim.worker_process",
                    "--state-dir", str(self.state_dir),
                    "--gpu", str(gpu),
                    "--name", f"{WORKER_NAME_PREFIX}{rank}",
                ]  # fmt: skip
                self._procs.append(
                    subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                )
        except BaseException:
            self.stop()
            raise

    def dead_ranks(self) -> dict[int, int]:
        """Rank → exit code of the workers that are gone."""
        return {rank: code for rank, proc in enumerate(self._procs) if (code := proc.poll()) is not None}

    def set_bytes(self, per_rank: list[int], timeout: float = 10.0) -> None:
        """Make rank r hold per_rank[r] bytes; returns once every worker has acked."""
        if len(per_rank) != len(self._procs):
            raise ValueError(f"{len(per_rank)} byte counts for {len(self._procs)} workers")
        # Write to all first so the workers update in parallel, like one collective allocation.
        problems: list[str] = []
        written: list[int] = []
        for rank, (proc, nbytes) in enumerate(zip(self._procs, per_rank, strict=True)):
            assert proc.stdin is not None
            try:
                proc.stdin.write(f"{int(nbytes)}\n".encode())
                proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                problems.append(self._describe(rank, "is dead"))
            else:
                written.append(rank)
        # Collect every ack even after a failure, so no stale reply is left for the next call.
        problems += self._await_acks(written, per_rank, timeout)
        if problems:
            raise SimWorkerError("; ".join(problems))

    def _await_acks(self, ranks: list[int], per_rank: list[int], timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        buffers: dict[int, bytes] = {}
        problems: list[str] = []
        with selectors.DefaultSelector() as sel:
            for rank in ranks:
                stdout = self._procs[rank].stdout
                assert stdout is not None
                sel.register(stdout.fileno(), selectors.EVENT_READ, rank)
                buffers[rank] = b""
            while buffers:
                left = deadline - time.monotonic()
                if left <= 0:
                    late = ", ".join(self._describe(r, "") for r in sorted(buffers))
                    problems.append(f"no ack within {timeout:.1f}s from {late}")
                    break
                for key, _ in sel.select(left):
                    rank = key.data
                    # os.read, not the buffered reader: select() must see all unread bytes.
                    chunk = os.read(key.fd, 4096)
                    if chunk:
                        buffers[rank] += chunk
                        if b"\n" not in buffers[rank]:
                            continue
                    sel.unregister(key.fd)
                    reply = buffers.pop(rank).split(b"\n", 1)[0].decode(errors="replace")
                    if not chunk:
                        problems.append(self._describe(rank, "died before acking"))
                    elif reply != f"ok {int(per_rank[rank])}":
                        problems.append(self._describe(rank, f"answered {reply!r}"))
        return problems

    def _describe(self, rank: int, what: str) -> str:
        proc = self._procs[rank]
        code = proc.poll()
        status = "" if code is None else f" (exit code {code})"
        return f"worker rank {rank} pid {proc.pid}{status} {what}".rstrip()

    def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM every worker, wait up to ``timeout`` in all, SIGKILL the rest, reap them all."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc in self._procs:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(BrokenPipeError):
                        stream.close()  # flushing stdin to a dead worker
        self._procs = []

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
