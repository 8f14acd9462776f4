"""The simulated GPUs of this host, kept in a state directory that every process can see.

Layout of the state directory (``$AUTOTUNER_SIM_STATE_DIR``, default
``${XDG_RUNTIME_DIR or /tmp}/autotuner-sim-gpus-<uid>``)::

    inventory.json                 {"gpus": [{"index", "name", "uuid", "memory_total_bytes"}, ...]}
    holders/gpu<index>-<pid>.json  {"pid", "create_time", "gpu", "bytes", "name", "listed", "peak_bytes"}

Simulated GPU memory is held by processes, the way NVML sees real GPU memory. Each holder (a
simulated TP worker, see ``autotuner.sim.worker_process``) writes one holder file per GPU, atomically
(tmp file + ``os.replace``), and heartbeats its mtime every ``HEARTBEAT_S``.

Liveness rule. A holder's bytes count on its GPU while

- its PID is alive, with the same ``create_time`` as recorded (so a reused PID does not count),
  and is not a zombie; OR
- less than ``RELEASE_DELAY_S`` (0.5 s, override with ``$AUTOTUNER_SIM_RELEASE_DELAY_S``) has
  passed since the file's mtime, i.e. since the holder's last write or heartbeat.

This models "GPU memory is released asynchronously, shortly after the process exits": a killed
worker's memory stays visible for up to the release delay, and an orphaned worker (its server
SIGKILLed) keeps holding memory because it is still alive. Readers delete the files of holders
that are dead and past the delay, so the directory does not grow.

Reads are cheap enough for an NVML poller (8 GPUs at 100 Hz): one ``os.scandir``, one ``stat`` and
one small JSON read per holder file of the GPU, and one read of ``/proc/<pid>/stat`` per holder;
the psutil ``create_time`` check runs once per (pid, create_time) and is cached.

Foreign holders (``autotuner sim hold``) stand for processes that are not engines: a desktop's Xorg,
someone's notebook. ``listed: false`` hides a holder from NVML's process lists while its memory still
counts, the way a container without the host's PID namespace sees the GPU.

The state directory must be a real directory owned by this user: under a shared ``/tmp`` anyone can
create it first, or a symlink in its place, and feed us their GPU state. Both are refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from autotuner.errors import AutotunerError, UserInputError
from autotuner.filelocks import exclusive
from autotuner.proc_identity import same_start

STATE_DIR_ENV = "AUTOTUNER_SIM_STATE_DIR"
RELEASE_DELAY_ENV = "AUTOTUNER_SIM_RELEASE_DELAY_S"
RELEASE_DELAY_S = 0.5
HEARTBEAT_S = 0.1

INVENTORY_FILE = "inventory.json"
# A fault the simulated driver reports while this file exists: {"error": NVML error code, "gpu": index|null}.
NVML_FAULT_FILE = "nvml-fault.json"
HOLDERS_DIR = "holders"
_LOCK_FILE = ".lock"
_TMP_PREFIX = ".tmp-"
_START_TICKS_CACHE_MAX = 256
_HAS_PROCFS = os.path.isdir("/proc/self")


class SimStateDirError(UserInputError):
    """The state directory is a symlink or someone else's."""


class GpuInventoryConflict(AutotunerError):  # noqa: N818 - the name the rest of the simulator uses
    """The state directory already describes other GPUs, and live processes hold memory on them."""

    def __init__(self, state_dir: Path, pids: list[int]) -> None:
        self.state_dir = state_dir
        self.pids = pids
        super().__init__(
            f"simulated GPUs in {state_dir} are already set up differently and memory is held by "
            f"PIDs {', '.join(str(p) for p in pids)}; stop those processes or use another "
            f"{STATE_DIR_ENV}"
        )


@dataclass(frozen=True)
class SimGpu:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int


@dataclass(frozen=True)
class Holder:
    pid: int
    gpu: int
    bytes: int
    name: str
    listed: bool = True  # False: NVML does not list it (another PID namespace), its memory still counts


def default_state_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / f"autotuner-sim-gpus-{os.getuid()}"


def state_dir_from_env() -> Path:
    """The state directory this process should use: ``$AUTOTUNER_SIM_STATE_DIR`` or the default."""
    value = os.environ.get(STATE_DIR_ENV)
    path = Path(value) if value else default_state_dir()
    check_state_dir(path)
    return path


def check_state_dir(path: Path) -> None:
    """Refuse a state directory that is a symlink or belongs to another user (when it exists)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SimStateDirError(
            f"simulated GPU state directory {path} is a symbolic link (to {os.readlink(path)}); refusing to "
            f"follow it: remove it, or set {STATE_DIR_ENV} to a directory of your own")
    if not stat.S_ISDIR(st.st_mode):
        raise SimStateDirError(f"simulated GPU state directory {path} is not a directory: remove it, or set "
                               f"{STATE_DIR_ENV} to a directory of your own")
    if st.st_uid != os.getuid():
        raise SimStateDirError(
            f"simulated GPU state directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
            f"someone else's GPU state is not ours to trust; set {STATE_DIR_ENV} to a directory of your own")


def release_delay_s() -> float:
    value = os.environ.get(RELEASE_DELAY_ENV)
    return float(value) if value else RELEASE_DELAY_S


def gpu_uuid(state_dir: Path, name: str, index: int) -> str:
    """A stable NVML-style UUID; it includes the state dir so two simulated hosts differ."""
    digest = hashlib.sha256(f"{Path(state_dir).resolve()}\0{name}\0{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def make_gpus(state_dir: Path, name: str, memory_total_bytes: int, count: int) -> list[SimGpu]:
    """``count`` identical GPUs, indexed 0..count-1, with UUIDs for this state dir."""
    return [SimGpu(i, name, gpu_uuid(state_dir, name, i), memory_total_bytes) for i in range(count)]


def holder_path(state_dir: Path, gpu: int, pid: int) -> Path:
    return Path(state_dir) / HOLDERS_DIR / f"gpu{gpu}-{pid}.json"


def write_json_atomic(path: Path, payload: object) -> None:
    """Write next to ``path`` and rename over it, so readers never see a half-written file."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def write_holder(state_dir: Path, *, gpu: int, pid: int, create_time: float, nbytes: int, name: str,
                 listed: bool = True, peak_bytes: int | None = None) -> Path:
    path = holder_path(state_dir, gpu, pid)
    payload = {"pid": pid, "create_time": create_time, "gpu": gpu, "bytes": nbytes, "name": name,
               "listed": listed, "peak_bytes": max(nbytes, peak_bytes or 0)}
    write_json_atomic(path, payload)
    return path


def inject_nvml_fault(state_dir: Path, error: int, gpu: int | None = None) -> None:
    """From now on, NVML memory and process queries (on `gpu`, or on every GPU) fail with `error`
    (an NVML error code: 15 GPU lost, 999 unknown), in every process watching this box."""
    write_json_atomic(Path(state_dir) / NVML_FAULT_FILE, {"error": int(error), "gpu": gpu})


def clear_nvml_fault(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (Path(state_dir) / NVML_FAULT_FILE).unlink()


class GpuHost:
    """Reads (and sets up) the simulated GPUs in one state directory."""

    def __init__(self, state_dir: Path, release_delay: float | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.holders_dir = self.state_dir / HOLDERS_DIR
        self.release_delay = release_delay_s() if release_delay is None else release_delay
        # (pid, create_time) -> the starttime field of /proc/<pid>/stat, verified once with psutil.
        self._start_ticks: dict[tuple[int, float], bytes] = {}

    # ---- inventory

    def inventory(self) -> list[SimGpu]:
        try:
            raw = json.loads((self.state_dir / INVENTORY_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return [SimGpu(**g) for g in raw.get("gpus", [])]

    def ensure_inventory(self, gpus: list[SimGpu]) -> None:
        """Make ``gpus`` the inventory, unless other GPUs are set up and in use (then raise)."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_state_dir(self.state_dir)  # it may have been there already, or appeared meanwhile
        self.holders_dir.mkdir(exist_ok=True)
        # The lock makes check-then-replace atomic among servers starting at the same time.
        with self._locked():
            current = self.inventory()
            if current == list(gpus):
                return
            if current:
                pids = sorted({h.pid for h in self._all_holders()})
                if pids:
                    raise GpuInventoryConflict(self.state_dir, pids)
            write_json_atomic(self.state_dir / INVENTORY_FILE, {"gpus": [asdict(g) for g in gpus]})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with exclusive(self.state_dir / _LOCK_FILE):
            yield

    def nvml_fault(self, index: int) -> int | None:
        """The NVML error code a query on GPU `index` fails with now, if a fault is injected."""
        try:
            raw = json.loads((self.state_dir / NVML_FAULT_FILE).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        gpu = raw.get("gpu")
        return int(raw["error"]) if gpu is None or int(gpu) == index else None

    # ---- memory

    def holders(self, index: int) -> list[Holder]:
        return self._scan(f"gpu{index}-")

    def used_bytes(self, index: int) -> int:
        return sum(h.bytes for h in self._scan(f"gpu{index}-"))

    def _all_holders(self) -> list[Holder]:
        return self._scan("gpu")

    def _scan(self, prefix: str) -> list[Holder]:
        try:
            it = os.scandir(self.holders_dir)
        except FileNotFoundError:
            return []
        found: list[Holder] = []
        now = time.time()
        with it:
            for entry in it:
                if not entry.name.startswith(prefix):
                    continue
                holder = self._read_holder(entry, now)
                if holder is not None:
                    found.append(holder)
        found.sort(key=lambda h: h.pid)
        return found

    def _read_holder(self, entry: os.DirEntry[str], now: float) -> Holder | None:
        try:
            st = entry.stat()
            with open(entry.path, "rb") as f:
                raw = json.loads(f.read())
            pid, create_time = int(raw["pid"]), float(raw["create_time"])
            holder = Holder(pid=pid, gpu=int(raw["gpu"]), bytes=int(raw["bytes"]), name=str(raw["name"]),
                            listed=bool(raw.get("listed", True)))
        except FileNotFoundError:
            return None  # replaced or cleaned up between scandir and open
        except (ValueError, KeyError, TypeError):
            return None  # not ours (writes are atomic, so never half-written)
        if now - st.st_mtime < self.release_delay or self._alive(pid, create_time):
            return holder
        # Dead and past the delay: clean up, unless a new process with the same PID just replaced
        # the file (a different inode), which is then its own live holder file.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(entry.path).st_ino == st.st_ino:
                os.unlink(entry.path)
        return None

    def _alive(self, pid: int, create_time: float) -> bool:
        key = (pid, create_time)
        ticks = self._start_ticks.get(key)
        if ticks is None:
            try:
                proc = psutil.Process(pid)
                actual = proc.create_time()
                zombie = proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False
            if not same_start(actual, create_time):
                return False  # the PID now belongs to another process
            stat = _proc_stat(pid)
            if stat is None:
                # No procfs (not Linux): nothing to cache, psutil answered already.
                return not _HAS_PROCFS and not zombie
            if len(self._start_ticks) >= _START_TICKS_CACHE_MAX:
                self._start_ticks.clear()
            ticks = self._start_ticks[key] = stat[1]
        stat = _proc_stat(pid)
        return stat is not None and stat[1] == ticks and stat[0] not in (b"Z", b"X")


def _proc_stat(pid: int) -> tuple[bytes, bytes] | None:
    """(state, starttime) from /proc/<pid>/stat, or None if the process (or procfs) is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after it are plain.
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0], fields[19]
