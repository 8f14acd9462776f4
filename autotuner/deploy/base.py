"""What every deployment target shares: the interface, the live config file with its `.previous`, and
running an argv with a timeout and an error that says what failed.

The live file is what `autotuner export --format yaml` writes (same renderer) and `vllm serve --config`
reads. Each write is atomic (temp file, fsync, rename) and keeps the file's mode; the file it replaces
is first kept, atomically too, as `<config>.previous`. A config path that is a symlink is followed: the
file it names is rewritten and its `.previous` kept beside it; the link itself is never replaced.
A kill at any moment leaves the live file old or new, never a mix, and `.previous` a whole older file.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx
import yaml

from autotuner.errors import AutotunerError
from autotuner.export.atomic import final_target, write_text_atomic
from autotuner.export.formats import Deployment, config_yaml_body, render_yaml
from autotuner.secrets import child_environment
from autotuner.vllm import FlagValue

DEFAULT_MODE = 0o644
PREVIOUS_SUFFIX = ".previous"
STDERR_LINES = 8
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class DeployError(AutotunerError):
    """A deploy step failed: the message names the target, the command and its exit code, and how to fix it."""


@runtime_checkable
class DeployTarget(Protocol):
    kind: str
    config_path: Path
    #: the target can stop and start production (a file target only with its stop/start pair)
    can_take_down: bool

    def current(self) -> dict[str, FlagValue] | None: ...
    # `deployment` (optional): the exporter's, whose certificate heads the file as in `export --format yaml`.
    def write(self, flags: Mapping[str, FlagValue], *, deployment: Deployment | None = None,
              keep_previous: bool = True) -> None: ...
    def restore_previous(self) -> bool: ...
    def apply(self) -> None: ...
    def stop(self) -> None: ...
    def start(self) -> None: ...
    def is_up(self) -> bool | None: ...


def render_config(flags: Mapping[str, FlagValue], deployment: Deployment | None = None) -> str:
    """The file's text. With the exporter's `Deployment` (certificate and all) it is byte for byte what
    `autotuner export --format yaml` writes for these flags; without, the same keys under a short header."""
    if deployment is not None:
        return render_yaml(replace(deployment, flags=dict(flags)))
    header = ("# vLLM --config written by autotuner deploy; run: vllm serve MODEL --config THIS_FILE\n"
              "# (the model is the command's positional argument, not a key of this file)\n")
    return header + config_yaml_body(flags)


class ConfigFile:
    """The live `--config` file and the one it replaced. A symlink at `path` is followed: its target is
    rewritten (the link and where it points stay the operator's), and `.previous` sits beside the target."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def live(self) -> Path:
        """The file written: `path`, or the file its symlink names now."""
        return final_target(self.path)

    @property
    def previous(self) -> Path:
        live = self.live
        return live.with_name(live.name + PREVIOUS_SUFFIX)

    def read(self, path: Path | None = None) -> dict[str, FlagValue] | None:
        path = path or self.path
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DeployError(f"cannot read {path}: {exc.strerror}; check its owner and mode") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DeployError(f"{path} is not valid YAML ({exc}); fix or remove it") from exc
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise DeployError(f"{path} does not hold a mapping of vLLM option names; fix or remove it")
        return {str(k): v for k, v in data.items()}

    def _mode(self) -> int:
        try:
            return stat.S_IMODE(self.live.stat().st_mode)
        except FileNotFoundError:
            return DEFAULT_MODE

    def write(self, flags: Mapping[str, FlagValue], deployment: Deployment | None = None,
              keep_previous: bool = True) -> None:
        """`keep_previous=False`: the live file is not kept as `.previous` (it just crashed production: a
        person rolling back by hand must not land on it)."""
        text = render_config(flags, deployment)
        mode = self._mode()
        path = self.live
        try:
            live = path.read_text() if path.exists() else None
            # Rewriting the flags that are already live (a resumed deploy) must not make them the
            # rollback target: `.previous` keeps what was there before them.
            if keep_previous and live is not None and self.read(path) != yaml.safe_load(text):
                write_text_atomic(self.previous, live, mode)
            write_text_atomic(path, text, mode)
        except OSError as exc:
            raise DeployError(f"cannot write {self.path}: {exc.strerror}; check that its directory is writable "
                              "and the disk has room") from exc

    def restore_previous(self) -> bool:
        """Put `.previous` back as the live file (it stays, so a repeated rollback is the same rollback)."""
        try:
            text = self.previous.read_text()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise DeployError(f"cannot read {self.previous}: {exc.strerror}") from exc
        try:
            write_text_atomic(self.live, text, self._mode())
        except OSError as exc:
            raise DeployError(f"cannot restore {self.path} from {self.previous.name}: {exc.strerror}") from exc
        return True


class FileBacked:
    """current / write / restore_previous for every kind: the live file is the source of truth."""

    kind: str
    config_path: Path
    can_take_down = True

    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self.file = ConfigFile(config_path)

    def current(self) -> dict[str, FlagValue] | None:
        return self.file.read()

    def write(self, flags: Mapping[str, FlagValue], *, deployment: Deployment | None = None,
              keep_previous: bool = True) -> None:
        """`deployment` (optional, from the exporter) adds its certificate header, as `export` does."""
        self.file.write(flags, deployment, keep_previous)

    def restore_previous(self) -> bool:
        return self.file.restore_previous()

    def previous(self) -> dict[str, FlagValue] | None:
        return self.file.read(self.file.previous)


def last_lines(text: str | bytes | None, n: int = STDERR_LINES) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [line for line in text.splitlines() if line.strip()][-n:]
    return " | ".join(lines)


def run_argv(argv: Sequence[str], what: str, timeout_s: float, hint: str = "",
             cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command without a shell. A non-zero exit (when `check`), a timeout or a missing program is a
    DeployError naming the command, its exit code and its last stderr lines (never the environment)."""
    shown = shlex.join(argv)
    try:
        # Production's own commands: never the daemon's token or the database's password.
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              stdin=subprocess.DEVNULL, check=False,
                              env=child_environment(os.environ, only_ours=True))
    except FileNotFoundError as exc:
        raise DeployError(f"{what}: {argv[0]!r} not found; install it or give its absolute path") from exc
    except PermissionError as exc:
        raise DeployError(f"{what}: {argv[0]!r} is not executable ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        tail = last_lines(exc.stderr)
        raise DeployError(f"{what}: `{shown}` did not finish within {timeout_s:g} s"
                          + (f"; last stderr: {tail}" if tail else "") + (f". {hint}" if hint else "")) from exc
    if check and done.returncode != 0:
        tail = last_lines(done.stderr) or last_lines(done.stdout)
        raise DeployError(f"{what}: `{shown}` exited with code {done.returncode}"
                          + (f"; last stderr: {tail}" if tail else "") + (f". {hint}" if hint else ""))
    return done



def wait_until_serving(target: DeployTarget, health_url: str, timeout_s: float, poll_s: float = 0.2) -> None:
    """After `apply`/`start`: poll `health_url` (e.g. http://127.0.0.1:8000/health) until it answers 200.
    A DeployError as soon as the target says the service is down (with why, where the target can tell,
    e.g. a command target's exit code and last output), or when `timeout_s` passes."""
    host = urlsplit(health_url).hostname or ""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    # Loopback never goes through a proxy from the environment.
    with httpx.Client(timeout=2.0, trust_env=host not in LOOPBACK) as http:
        while True:
            try:
                status = http.get(health_url).status_code
                if status == 200:
                    return
                last = f"HTTP {status}"
            except httpx.TransportError as exc:
                last = type(exc).__name__
            if target.is_up() is False:
                why = getattr(target, "failure", lambda: None)()
                raise DeployError(f"{target.kind} target: the service went down while starting"
                                  + (f": {why}" if why else f" ({health_url}: {last})"))
            if time.monotonic() >= deadline:
                raise DeployError(f"{target.kind} target: {health_url} not healthy within {timeout_s:g} s "
                                  f"(last: {last}); the service may need longer to load (raise the timeout) or "
                                  "be failing: look at its log")
            time.sleep(poll_s)
