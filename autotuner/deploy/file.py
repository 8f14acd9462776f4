"""`kind: file`: write the config only; a person (or their own tooling) restarts the service."""

from __future__ import annotations

from autotuner.deploy.base import FileBacked
from autotuner.deploy.spec import FileSpec


class FileTarget(FileBacked):
    kind = "file"

    def __init__(self, spec: FileSpec) -> None:
        super().__init__(spec.config_path)
        self.spec = spec

    def apply(self) -> None:
        """Nothing to restart: the file is the deployment."""

    def stop(self) -> None:
        """Production is not ours to take down."""

    def start(self) -> None:
        """Production is not ours to start."""

    def is_up(self) -> bool | None:
        return None
