"""`kind: systemd`: write the config file the unit's `--config` reads (and, when asked, a drop-in that
points the unit at it), then `systemctl daemon-reload` and `systemctl restart UNIT`."""

from __future__ import annotations

from autotuner.deploy.base import DeployError, FileBacked, run_argv
from autotuner.deploy.spec import SystemdSpec
from autotuner.export.atomic import write_text_atomic
from autotuner.export.formats import systemd_command

STATUS_TIMEOUT_S = 30.0


class SystemdTarget(FileBacked):
    kind = "systemd"

    def __init__(self, spec: SystemdSpec) -> None:
        super().__init__(spec.config_path)
        self.spec = spec

    def drop_in_text(self) -> str | None:
        if self.spec.drop_in is None:
            return None
        argv = [*self.spec.drop_in.exec_start, "--config", str(self.config_path)]
        return ("# Written by autotuner deploy: the unit serves the tuned --config file.\n"
                "[Service]\n"
                "ExecStart=\n"  # an empty ExecStart= clears the unit's own before ours replaces it
                f"ExecStart={systemd_command(argv)}\n")

    def _write_drop_in(self) -> bool:
        """True when the drop-in changed (systemd must reload its units)."""
        text = self.drop_in_text()
        if text is None:
            return False
        path = self.spec.drop_in_path
        try:
            if path.is_file() and path.read_text() == text:
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        except OSError as exc:
            raise DeployError(f"cannot write the drop-in {path}: {exc.strerror}; the daemon's user needs write "
                              f"access to {path.parent}") from exc
        return True

    def _systemctl(self, *args: str, timeout_s: float | None = None, check: bool = True) -> int:
        hint = f"see `journalctl -u {self.spec.unit} -n 50` and `systemctl status {self.spec.unit}`"
        done = run_argv([*self.spec.systemctl, *args], f"systemd unit {self.spec.unit}",
                        timeout_s or self.spec.timeout_s, hint=hint, check=check)
        return done.returncode

    def apply(self) -> None:
        self._write_drop_in()
        # Always reload: a person may have edited the unit since, and restart warns about stale units.
        self._systemctl("daemon-reload", timeout_s=STATUS_TIMEOUT_S)
        self._systemctl("restart", self.spec.unit)

    def stop(self) -> None:
        self._systemctl("stop", self.spec.unit)

    def start(self) -> None:
        if self._write_drop_in():
            self._systemctl("daemon-reload", timeout_s=STATUS_TIMEOUT_S)
        self._systemctl("start", self.spec.unit)

    def is_up(self) -> bool | None:
        # is-active exits 0 for "active" only ("activating", "failed", "inactive" are not up).
        return self._systemctl("is-active", "--quiet", self.spec.unit, timeout_s=STATUS_TIMEOUT_S, check=False) == 0
