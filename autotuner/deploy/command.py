"""`kind: command`: the user's own start / stop / status commands (argv lists, no shell).

`start` may daemonize (it exits 0 within `start_grace_s`; then `stop` and `status` manage the service)
or stay in the foreground, as `vllm serve` or `autotuner sim serve` do. A foreground start is a
supervised child: its own session and process group, its output appended to a log file, and an entry
in the engine registry, so that if the daemon is killed the next run (tuner or daemon) stops the
orphan instead of leaving it to hold the port and the GPUs. `stop` ends the whole group: SIGTERM,
`stop_grace_s`, then SIGKILL to whatever is left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotuner.deploy.base import DeployError, FileBacked, last_lines, run_argv
from autotuner.deploy.spec import CommandSpec
from autotuner.engine.registry import EngineRegistry, autotuner_home, engine_processes, stop_processes
from autotuner.private_files import append_binary
from autotuner.proc_identity import clock, create_time, listening_tree
from autotuner.secrets import child_environment

LOG_TAIL_BYTES = 16384


@dataclass
class Supervised:
    proc: subprocess.Popen[bytes]
    leader_create_time: float
    log_path: Path
    log_offset: int  # where this start's output begins in the (appended) log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self.log_offset, self.log_path.stat().st_size - LOG_TAIL_BYTES))
                return last_lines(f.read())
        except OSError:
            return ""


class CommandTarget(FileBacked):
    kind = "command"

    def __init__(self, spec: CommandSpec, registry: EngineRegistry | None = None,
                 production_port: int | None = None) -> None:
        super().__init__(spec.config_path)
        self.spec = spec
        self.production_port = production_port  # where an unsupervised production listens (see stop)
        self.registry = registry or EngineRegistry()
        self._child: Supervised | None = None
        self._exit_note: str | None = None

    @property
    def log_path(self) -> Path:
        return self.spec.log or autotuner_home() / "deploy" / f"{self.config_path.name}.log"

    @property
    def child_pid(self) -> int | None:
        """The supervised start command's PID (its process group), while it runs."""
        return self._child.pid if self._child is not None and self._child.alive() else None

    # --- the interface -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._child is not None and self._child.alive():
            return
        self._child = None
        # A production child of a killed daemon would still hold the port (and the GPUs): stop it first.
        self.registry.reap_orphans()
        argv = self.spec.start
        # Not the daemon's token nor its database password (secrets.child_environment).
        env = child_environment(os.environ, only_ours=True)
        with append_binary(self.log_path) as log, self.registry.launching(env) as env:  # 0600: run details
            offset = log.tell()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=self.spec.cwd, start_new_session=True, env=env)
            except OSError as exc:
                raise DeployError(f"start: cannot run {argv[0]!r} ({exc.strerror}); give an executable, e.g. its "
                                  "absolute path") from exc
            child = Supervised(proc, create_time(proc.pid) or clock(), self.log_path, offset)
            try:
                self.registry.add(proc.pid, argv[0], child.leader_create_time)
            except BaseException:
                self._end_group(child, grace_s=0.0)
                raise
        try:
            code = proc.wait(timeout=self.spec.start_grace_s)
        except subprocess.TimeoutExpired:
            self._child = child  # a foreground service: ours to supervise
            self._exit_note = None
            return
        if code == 0:
            # It daemonized: the service is now stop's and status's, not a child of ours to reap.
            self.registry.remove(proc.pid)
            return
        self._end_group(child, grace_s=0.0)
        raise DeployError(self._exited(child, code, "start"))

    def stop(self) -> None:
        failed: DeployError | None = None
        if self.spec.stop is not None:
            try:
                run_argv(self.spec.stop, "stop", self.spec.timeout_s, cwd=self.spec.cwd,
                         hint="fix the stop command, or stop the service by hand before the next deploy")
            except DeployError as exc:
                failed = exc
        child, self._child = self._child, None
        if child is not None:
            # A supervised service goes down by signals even when the stop command failed.
            if not self._end_group(child, self.spec.stop_grace_s):
                raise DeployError(f"stop: processes of `{shlex.join(self.spec.start)}` (process group {child.pid}) "
                                  "survived SIGKILL; they may be stuck in the kernel (GPU driver): check `ps -g "
                                  f"{child.pid}`")
            return
        if failed is not None:
            raise failed
        if self.spec.stop is None and self.is_up():
            # Production started before the daemon (by hand, or by the command `init` read): the process
            # whose command line is exactly our start argv is the service, stopped as we stop our own.
            procs = self._running_start_command()
            if not procs:
                raise DeployError("stop: the service is up but was not started by this process, no process runs "
                                  f"`{shlex.join(self.spec.start)}`, and `stop:` is not set; add a stop command "
                                  "(argv list) to the deploy section")
            if not stop_processes(procs, grace_s=self.spec.stop_grace_s):
                raise DeployError(f"stop: `{shlex.join(self.spec.start)}` (pid {procs[0].pid}) survived SIGKILL")

    def apply(self) -> None:
        if self.is_up() is not False:
            self.stop()
        self.start()

    def is_up(self) -> bool | None:
        if self.spec.status is not None:
            try:
                done = run_argv(self.spec.status, "status", self.spec.status_timeout_s, cwd=self.spec.cwd,
                                check=False)
            except DeployError as exc:
                if "did not finish" in str(exc):
                    return None  # a hung status command cannot tell
                raise
            return done.returncode == 0
        if self._child is None:
            return False
        if self._child.alive():
            return True
        self._note_exit()
        return False

    # --- beyond the interface ------------------------------------------------------------------------

    def _running_start_command(self) -> list[psutil.Process]:
        """This user's processes running exactly `start`, with their descendants (TP workers); else the
        process listening on production's port — production as it ran before the daemon, whose command line
        still holds the flags that now live in the config file (`init --from-cmd` wrote `start` from it)."""
        found: list[psutil.Process] = []
        uid = os.getuid()
        for proc in psutil.process_iter(["cmdline", "uids", "status"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["uids"] is None:
                    continue
                if proc.info["uids"].real == uid and proc.info["cmdline"] == list(self.spec.start):
                    found += [proc, *proc.children(recursive=True)]
        if found or self.production_port is None:
            return found
        return listening_tree(self.production_port, uid)

    def failure(self) -> str | None:
        """Why the supervised service is not running (exit code and last output), when it exited on its own."""
        if self._child is not None and not self._child.alive():
            self._note_exit()
        return self._exit_note

    def _note_exit(self) -> None:
        child = self._child
        if child is None or child.proc.returncode is None:
            return
        self._exit_note = self._exited(child, child.proc.returncode, "the service")
        # Its workers may outlive it (and hold the port): end the group and forget it.
        self._end_group(child, grace_s=0.0)
        self._child = None

    def _exited(self, child: Supervised, code: int, what: str) -> str:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = child.output_tail()
        return (f"{what} `{shlex.join(self.spec.start)}` {how}" + (f"; last output: {tail}" if tail else "")
                + f" (full log: {child.log_path})")

    def _end_group(self, child: Supervised, grace_s: float) -> bool:
        """SIGTERM the whole group, wait for the leader, SIGKILL what is left; True when nothing is."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=grace_s)
        procs = engine_processes(child.pid, child.leader_create_time)
        gone = stop_processes(procs, grace_s=min(grace_s, 5.0))
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=5)
        if gone:
            self.registry.remove(child.pid, [p.pid for p in procs] + [child.pid])
        return gone
