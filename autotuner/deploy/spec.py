"""The `deploy:` section of the daemon config: where the tuned vLLM `--config` file goes and how the
service is made to run it. One model per kind, told apart by `kind`.

Commands are argv lists, run without a shell: a string is refused (it would need a shell to split, and
a shell would expand whatever a value holds). Paths are checked when the config is validated, so that
a deploy never fails hours later on a directory that does not exist or cannot be written.

Relative paths are taken against `base_dir` from the validation context (the daemon passes its config
file's directory), else against the working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autotuner.errors import UserInputError, quoted
from autotuner.export.atomic import final_target

DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
DROP_IN_NAME = "autotuner.conf"
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(service)$")
_COMPOSE_SERVICE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


class DeploySpecError(UserInputError):
    """A `deploy:` section that does not validate (exit 2)."""


def _argv(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError(f"{quoted(value)} is a string; give an argv list instead, e.g. [\"systemctl\", \"restart\", "
                         "\"vllm\"] (YAML: [a, b, c]): commands run without a shell, so nothing splits or "
                         "expands a string")
    if isinstance(value, list):
        if not value:
            raise ValueError("an empty command; give the program and its arguments as a list")
        bad = [v for v in value if not isinstance(v, str | int | float) or isinstance(v, bool)]
        if bad:
            raise ValueError(f"argv items must be strings; {quoted(bad[0])} is not")
        if not str(value[0]).strip():
            raise ValueError("the program (the first item) is empty; give its name or path, e.g. [systemctl, ...]")
        return [str(v) for v in value]
    return value


Argv = Annotated[list[str], BeforeValidator(_argv)]


def _resolve(path: Path, info: ValidationInfo) -> Path:
    path = path.expanduser()
    if not path.is_absolute():
        base = (info.context or {}).get("base_dir")
        path = (Path(base) if base is not None else Path.cwd()) / path
    return path


def check_writable_dir(directory: Path) -> None:
    """A directory the deploy will write into: exists, is one, and this user may create files in it."""
    if not directory.exists():
        raise ValueError(f"directory {directory} does not exist; create it (mkdir -p {directory}) "
                         "and make it writable by the user the daemon runs as")
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"directory {directory} is not writable by this user (uid {os.getuid()}); "
                         f"give the daemon's user write access (e.g. chown or a group with write permission), "
                         "or choose a config_path in a directory it can write")


class _Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config_path: Path = Field(description="the vLLM --config YAML the service reads; written atomically, the "
                                          "live one kept as <config_path>.previous")

    @field_validator("config_path")
    @classmethod
    def _config_path(cls, value: Path, info: ValidationInfo) -> Path:
        path = _resolve(value, info)
        if path.is_dir():
            raise ValueError(f"{path} is a directory; give the file the service's --config names, "
                             "e.g. /etc/vllm/tuned.yaml")
        if path.suffix not in (".yaml", ".yml"):
            raise ValueError(f"{path}: vLLM reads --config files as YAML; use a .yaml file name")
        # A symlink is followed: the file it names, in its own directory, is what each deploy rewrites.
        check_writable_dir(final_target(path).parent)
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise ValueError(f"{path} exists but this user cannot read and write it; fix its owner "
                             "or mode")
        return path

    @staticmethod
    def _under(value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve(value, info)


class FileSpec(_Target):
    """Write the config; a person (or something else) restarts the service. With `stop` and `start`
    (argv lists, run to completion like `systemctl stop vllm`), the daemon can also take production down to
    tune on its GPUs and bring it back; without them it never does (its cycles tune only where production
    need not stop, and propose what they find)."""

    kind: Literal["file"]
    stop: Argv | None = Field(None, description="takes production down and returns (e.g. [systemctl, stop, vllm])")
    start: Argv | None = Field(None, description="brings production up on the config file and returns")
    timeout_s: float = Field(900.0, gt=0, le=7200, description="for the stop and start commands")

    @model_validator(mode="after")
    def _pair(self) -> FileSpec:
        if (self.start is None) != (self.stop is None):
            raise ValueError("give both stop and start, or neither (the daemon that takes production down "
                             "must be able to bring it back)")
        return self


class CommandSpec(_Target):
    """The user's own commands. `start` may stay in the foreground (then it is a supervised child of the
    daemon, stopped as a whole process group) or daemonize and exit 0 within `start_grace_s`."""

    kind: Literal["command"]
    start: Argv
    stop: Argv | None = Field(None, description="needed when start daemonizes; a supervised child is "
                                                "stopped by signals when this is absent")
    status: Argv | None = Field(None, description="exit code 0 = up; absent: the supervised child being alive")
    cwd: Path | None = None
    log: Path | None = Field(None, description="where a supervised start command's output goes "
                                               "(default: $AUTOTUNER_HOME/deploy/<config name>.log)")
    start_grace_s: float = Field(3.0, gt=0, le=600)
    stop_grace_s: float = Field(30.0, gt=0, le=3600)
    timeout_s: float = Field(120.0, gt=0, le=3600, description="for the stop and daemonizing start commands")
    status_timeout_s: float = Field(10.0, gt=0, le=600)

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        path = cls._under(value, info)
        if path is not None and not path.is_dir():
            raise ValueError(f"{path} is not a directory")
        return path

    @field_validator("log")
    @classmethod
    def _log(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        path = cls._under(value, info)
        if path is not None:
            check_writable_dir(path.parent)
        return path


class DropIn(BaseModel):
    """Point the unit at config_path with a drop-in: `ExecStart=` reset to `exec_start` + `--config FILE`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exec_start: Argv = Field(description="the unit's vllm serve command without --config, e.g. "
                                         "[/usr/bin/vllm, serve, MODEL, --port, '8000']")

    @field_validator("exec_start")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("/"):
            raise ValueError(f"systemd needs an absolute program path; {value[0]!r} is not "
                             "(e.g. /usr/bin/env vllm, or the virtualenv's bin/vllm)")
        if "--config" in value:
            raise ValueError("leave --config out; the drop-in adds --config config_path")
        return value


class SystemdSpec(_Target):
    kind: Literal["systemd"]
    unit: str
    unit_dir: Path = Field(DEFAULT_UNIT_DIR, description="where drop-ins go")
    systemctl: Argv = Field(["systemctl"], description="the systemctl command (e.g. [systemctl, --user])")
    timeout_s: float = Field(900.0, gt=0, le=7200, description="for systemctl restart (vLLM may load for minutes)")
    drop_in: DropIn | None = Field(None, description="also write UNIT.d/autotuner.conf pointing the unit at "
                                                     "config_path; absent: the unit's --config already does")

    @field_validator("unit")
    @classmethod
    def _unit(cls, value: str) -> str:
        if not _UNIT_NAME.match(value):
            if _UNIT_NAME.match(value + ".service"):
                return value + ".service"
            raise ValueError(f"unit {value!r}: expected a service unit name such as vllm.service")
        return value

    @field_validator("unit_dir")
    @classmethod
    def _unit_dir(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve(value, info)

    @field_validator("drop_in")
    @classmethod
    def _drop_in_dir(cls, value: DropIn | None, info: ValidationInfo) -> DropIn | None:
        if value is not None and "unit" in info.data and "unit_dir" in info.data:
            target = info.data["unit_dir"] / f"{info.data['unit']}.d"
            check_writable_dir(target if target.exists() else target.parent)
        return value

    @property
    def drop_in_dir(self) -> Path:
        return self.unit_dir / f"{self.unit}.d"

    @property
    def drop_in_path(self) -> Path:
        return self.drop_in_dir / DROP_IN_NAME


class ComposeSpec(_Target):
    """The config file is the one the service mounts; `up -d --force-recreate` makes a new container,
    which mounts the path afresh (an atomic write is a new inode: a running container still sees the old)."""

    kind: Literal["compose"]
    compose_file: Path
    service: str
    project_name: str | None = None
    docker: Argv = Field(["docker"], description="the docker command; compose is its `compose` subcommand")
    timeout_s: float = Field(900.0, gt=0, le=7200)

    @field_validator("compose_file")
    @classmethod
    def _compose_file(cls, value: Path, info: ValidationInfo) -> Path:
        path = _resolve(value, info)
        if not path.is_file():
            raise ValueError(f"{path} does not exist (give the compose file that defines the service)")
        return path

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        if not _COMPOSE_SERVICE.match(value):
            raise ValueError(f"service {value!r}: not a compose service name")
        return value


DeploySpec = Annotated[FileSpec | CommandSpec | SystemdSpec | ComposeSpec, Field(discriminator="kind")]
KINDS = ("file", "command", "systemd", "compose")
_ADAPTER: TypeAdapter[DeploySpec] = TypeAdapter(DeploySpec)


def parse_deploy_spec(data: Any, base_dir: Path | None = None, where: str = "deploy") -> DeploySpec:
    """Validate a `deploy:` mapping; one DeploySpecError naming the field and what to do."""
    if isinstance(data, dict) and "kind" not in data:
        raise DeploySpecError(f"{where}.kind: missing; use one of {', '.join(KINDS)}")
    try:
        return _ADAPTER.validate_python(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if str(p) not in KINDS)
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":
            message = f"unknown kind {err.get('input', {}).get('kind')!r}; use one of {', '.join(KINDS)}"
        elif err["type"] == "extra_forbidden":
            message = "not a setting of this kind; remove it (a typo?)"
        raise DeploySpecError(f"{where}{'.' + loc if loc else ''}: {message}") from None
