"""Deployment targets: put a tuned `vllm serve --config` file in place and make the service run it.

    target = make_target(parse_deploy_spec(config["deploy"], base_dir=config_dir))
    target.write(flags)        # atomic; the live file kept as <config>.previous
    target.apply()             # restart (or start) the service; DeployError says what failed
    ...                        # verify production
    target.restore_previous(); target.apply()   # rollback
"""

from __future__ import annotations

from autotuner.deploy.base import ConfigFile, DeployError, DeployTarget, render_config, wait_until_serving
from autotuner.deploy.command import CommandTarget
from autotuner.deploy.compose import ComposeTarget
from autotuner.deploy.file import FileTarget
from autotuner.deploy.spec import (
    CommandSpec,
    ComposeSpec,
    DeploySpec,
    DeploySpecError,
    FileSpec,
    SystemdSpec,
    parse_deploy_spec,
)
from autotuner.deploy.systemd import SystemdTarget
from autotuner.engine.registry import EngineRegistry

__all__ = [
    "CommandSpec", "CommandTarget", "ComposeSpec", "ComposeTarget", "ConfigFile", "DeployError", "DeploySpec",
    "DeploySpecError", "DeployTarget", "FileSpec", "FileTarget", "SystemdSpec", "SystemdTarget", "make_target",
    "parse_deploy_spec", "render_config", "wait_until_serving",
]


def make_target(spec: DeploySpec, registry: EngineRegistry | None = None,
                production_port: int | None = None) -> DeployTarget:
    """`registry`: where a supervised `command` start is recorded (default: $AUTOTUNER_HOME's).
    `production_port`: where production listens, for a `command` target to stop the production it did not
    start (see CommandTarget.stop)."""
    if isinstance(spec, FileSpec):
        return FileTarget(spec)
    if isinstance(spec, CommandSpec):
        return CommandTarget(spec, registry, production_port)
    if isinstance(spec, SystemdSpec):
        return SystemdTarget(spec)
    return ComposeTarget(spec)
