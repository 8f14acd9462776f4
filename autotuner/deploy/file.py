"""`kind: file`: write the config; a person (or their own tooling) restarts the service. With a
`stop`/`start` pair the daemon may take production down and bring it back itself."""

from __future__ import annotations

from autotuner.deploy.base import FileBacked, run_argv
from autotuner.deploy.spec import FileSpec


class FileTarget(FileBacked):
    kind = "file"

    def __init__(self, spec: FileSpec) -> None:
        super().__init__(spec.config_path)
        self.spec = spec

    @property
    def can_take_down(self) -> bool:
        return self.spec.stop is not None and self.spec.start is not None

    def apply(self) -> None:
        """Without a stop/start pair the file is the deployment: nothing to restart."""
        if self.can_take_down:
            self.stop()
            self.start()

    def stop(self) -> None:
        """Production is not ours to take down without a `stop` command (the daemon never asks then:
        `can_take_down` is False)."""
        if self.spec.stop is not None:
            run_argv(self.spec.stop, "stop", self.spec.timeout_s, hint="fix deploy.stop")

    def start(self) -> None:
        """Production is not ours to start without a `start` command."""
        if self.spec.start is not None:
            run_argv(self.spec.start, "start", self.spec.timeout_s, hint="fix deploy.start")

    def is_up(self) -> bool | None:
        return None
