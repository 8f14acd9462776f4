"""`kind: compose`: write the config file the service mounts, then `docker compose up -d` the service.

`--force-recreate` on apply: the new container mounts the path afresh. A running container still sees
the old file after an atomic write (a rename makes a new inode; a single-file bind mount keeps the old
one), and compose would not recreate a container whose definition did not change.
"""

from __future__ import annotations

from autotuner.deploy.base import FileBacked, run_argv
from autotuner.deploy.spec import ComposeSpec

STATUS_TIMEOUT_S = 60.0


class ComposeTarget(FileBacked):
    kind = "compose"

    def __init__(self, spec: ComposeSpec) -> None:
        super().__init__(spec.config_path)
        self.spec = spec

    def _compose(self, *args: str, timeout_s: float | None = None) -> str:
        project = ["-p", self.spec.project_name] if self.spec.project_name else []
        argv = [*self.spec.docker, "compose", "-f", str(self.spec.compose_file), *project, *args]
        hint = (f"see `docker compose -f {self.spec.compose_file} logs {self.spec.service}`; is the Docker daemon "
                "running and may this user use it?")
        return run_argv(argv, f"compose service {self.spec.service}", timeout_s or self.spec.timeout_s,
                        hint=hint, cwd=self.spec.compose_file.parent).stdout

    def apply(self) -> None:
        self._compose("up", "-d", "--force-recreate", "--no-deps", self.spec.service)

    def stop(self) -> None:
        self._compose("stop", self.spec.service)

    def start(self) -> None:
        self._compose("up", "-d", "--no-deps", self.spec.service)

    def is_up(self) -> bool | None:
        out = self._compose("ps", "--status", "running", "--quiet", self.spec.service, timeout_s=STATUS_TIMEOUT_S)
        return bool(out.strip())
