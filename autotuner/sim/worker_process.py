"""A simulated tensor-parallel worker: one process that holds simulated memory on one GPU.

    python -m autotuner.sim.worker_process --state-dir D --gpu I --name "VLLM::Worker_TP0"

Protocol: each line on stdin is an integer byte count to hold from now on; the worker writes its
holder file (see ``autotuner.sim.gpu_state``) and then acks with ``ok <bytes>`` on stdout. A line
that is not a non-negative integer gets ``error <reason>`` and changes nothing.

Lifetime, modelled on vLLM's workers:
- SIGTERM / SIGINT: exit 0 at once. The holder file stays; the release delay frees the memory.
- stdin EOF (the server died, e.g. SIGKILLed): keep holding and heartbeating as an orphan. vLLM's
  orphaned workers keep GPU memory until killed; ours give up after 10 minutes
  (``$AUTOTUNER_SIM_ORPHAN_TIMEOUT_S``, default 600) so a crashed test cannot hold a machine forever.
- The state directory disappears (a test's tmp dir removed): exit 0, nothing left to hold.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from autotuner.sim.gpu_state import HEARTBEAT_S, HOLDERS_DIR, holder_path, write_holder

ORPHAN_TIMEOUT_ENV = "AUTOTUNER_SIM_ORPHAN_TIMEOUT_S"
ORPHAN_TIMEOUT_S = 600.0


class HolderFile:
    """This process's holder file on one GPU; shared by the main and the heartbeat thread."""

    def __init__(self, state_dir: Path, gpu: int, name: str, listed: bool = True) -> None:
        self.state_dir = state_dir
        self.gpu = gpu
        self.name = name
        self.listed = listed
        self.pid = os.getpid()
        self.create_time = psutil.Process(self.pid).create_time()
        self.path = holder_path(state_dir, gpu, self.pid)
        self._lock = threading.Lock()
        self._bytes: int | None = None  # None until the first write: nothing to heartbeat yet
        self._peak = 0  # the most this process held: ground truth for tests of what a monitor saw

    def hold(self, nbytes: int) -> None:
        with self._lock:
            self._peak = max(self._peak, nbytes)
            self._write(nbytes)
            self._bytes = nbytes

    def _write(self, nbytes: int) -> None:
        write_holder(
            self.state_dir, gpu=self.gpu, pid=self.pid, create_time=self.create_time, nbytes=nbytes,
            name=self.name, listed=self.listed, peak_bytes=self._peak,
        )  # fmt: skip

    def heartbeat(self) -> bool:
        """Refresh the mtime; False once the state directory is gone."""
        with self._lock:
            if not (self.state_dir / HOLDERS_DIR).is_dir():
                return False
            if self._bytes is None:
                return True
            try:
                os.utime(self.path)
            except FileNotFoundError:
                # Readers only delete files of dead holders; if ours went anyway, restore it.
                self._write(self._bytes)
            return True


def start_heartbeat(holder: HolderFile) -> None:
    threading.Thread(target=_heartbeat_loop, args=(holder,), name="heartbeat", daemon=True).start()


def _heartbeat_loop(holder: HolderFile) -> None:
    while True:
        try:
            alive = holder.heartbeat()
        except OSError:
            alive = False
        if not alive:
            # The main thread may be blocked reading stdin; nothing is buffered (acks are flushed).
            os._exit(0)
        time.sleep(HEARTBEAT_S)


def _exit_now(signum: int, frame: object) -> None:
    # Prompt exit like a killed CUDA process; the holder file stays and the release delay applies.
    os._exit(0)


def _set_title(name: str) -> None:
    try:
        import setproctitle  # type: ignore[import-not-found]
    except ImportError:
        return
    setproctitle.setproctitle(name)


def _serve(holder: HolderFile) -> None:
    """Apply byte counts from stdin until EOF (or until nobody reads our acks)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while line := stdin.readline():
        text = line.decode("utf-8", "replace").strip()
        if not text:
            continue
        try:
            nbytes = int(text)
            if nbytes < 0:
                raise ValueError("negative")
        except ValueError:
            reply = f"error bad byte count {text!r}"
        else:
            holder.hold(nbytes)
            reply = f"ok {nbytes}"
        try:
            stdout.write(reply + "\n")
            stdout.flush()
        except BrokenPipeError:
            return  # the server is gone: become an orphan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotuner.sim.worker_process")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--gpu", type=int, required=True)
    parser.add_argument("--name", default="VLLM::Worker")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    _set_title(args.name)

    holders_dir = args.state_dir / HOLDERS_DIR
    if not args.state_dir.is_dir():
        print(f"simulated GPU state dir {args.state_dir} does not exist", file=sys.stderr)
        return 2
    holders_dir.mkdir(exist_ok=True)

    holder = HolderFile(args.state_dir, args.gpu, args.name)
    start_heartbeat(holder)
    _serve(holder)

    # Orphaned: the heartbeat thread keeps the memory held (or exits if the state dir goes).
    time.sleep(float(os.environ.get(ORPHAN_TIMEOUT_ENV) or ORPHAN_TIMEOUT_S))
    return 0


if __name__ == "__main__":
    sys.exit(main())
