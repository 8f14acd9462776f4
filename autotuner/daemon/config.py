"""The daemon's config file (`autotuner daemon run CONFIG`), validated at load like a scenario: a bad file
is `DaemonConfigError` naming the file, the line and the field (exit code 2), before anything starts.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotuner.daemon.notify import NotifySettings
from autotuner.deploy.spec import KINDS, DeploySpec
from autotuner.durations import MAX_DURATION_S
from autotuner.errors import UserInputError, quoted
from autotuner.filelines import first_error, line_of, load_mapping
from autotuner.scenario import Scenario, load_scenario
from autotuner.twin import TWIN_FIRST


class DaemonConfigError(UserInputError):
    """A daemon config file that does not validate."""


_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*([dhms]?)\s*)+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms]?)")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def duration_s(text: str | float | int) -> float:
    """`7d`, `2h`, `90m`, `45s`, `1h30m`, or plain seconds (finite, at most a year: 400 digits are a typo)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if not text >= 0:  # NaN too
            raise ValueError(f"duration {quoted(text, 60)} must be ≥ 0")
        seconds = float(text)
    elif not isinstance(text, str) or len(text) > 100 or not _DURATION.match(text):
        raise ValueError(f"duration {quoted(text, 60)}: expected e.g. 7d, 2h, 90m, 45s or 1h30m")
    else:
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    if not seconds <= MAX_DURATION_S:
        raise ValueError(f"duration {quoted(text, 60)}: at most 366 days")
    return seconds


_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_WINDOW = re.compile(rf"^\s*{_CLOCK}\s*-\s*{_CLOCK}\s*$")


@dataclass(frozen=True)
class Window:
    """A daily window of the box's local time, `01:00-06:00` (it may cross midnight: `22:00-04:00`)."""

    start: dtime
    end: dtime
    text: str

    @classmethod
    def parse(cls, text: str) -> Window:
        m = _WINDOW.match(text)
        if not m:
            raise ValueError(f"window {text!r}: expected HH:MM-HH:MM (local time), e.g. 01:00-06:00")
        h1, m1, s1, h2, m2, s2 = (int(g) if g else 0 for g in m.groups())
        if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59 or s1 > 59 or s2 > 59:
            raise ValueError(f"window {text!r}: hours 0-23, minutes and seconds 0-59")
        start, end = dtime(h1, m1, s1), dtime(h2, m2, s2)
        if start == end:
            raise ValueError(f"window {text!r}: start and end are the same time; leave `window` out for any time")
        return cls(start, end, text.strip())

    def contains(self, when: datetime) -> bool:
        t = when.time()
        if self.start < self.end:
            return self.start <= t < self.end
        return t >= self.start or t < self.end

    def seconds_left(self, when: datetime) -> float:
        """Seconds until the window closes (0 when outside it)."""
        if not self.contains(when):
            return 0.0
        end = datetime.combine(when.date(), self.end, when.tzinfo)
        if end <= when:
            end += timedelta(days=1)
        return (end - when).total_seconds()

    def next_open(self, when: datetime) -> datetime:
        if self.contains(when):
            return when
        start = datetime.combine(when.date(), self.start, when.tzinfo)
        return start if start > when else start + timedelta(days=1)


class _Model(BaseModel):
    # No NaN or infinity where a number means an interval or a count (the scenario's rule too).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ProductionSettings(_Model):
    endpoint: str = Field(pattern=r"^https?://[^/\s]+(/\S*)?$", max_length=2048)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="the NAME of the variable holding the API key, never a key")
    log: Path | None = None
    gpus: list[int] | None = Field(default=None, description="the GPU indices production runs on, when not all "
                                   "of the box's: a scenario whose engine.gpus are disjoint from them tunes "
                                   "while production keeps serving")


class DriftSettings(_Model):
    p95_ratio: float = Field(default=1.25, gt=1)
    window_s: float = Field(default=3600, gt=0)
    min_requests: int = Field(default=200, ge=1)

    _window = field_validator("window_s", mode="before")(classmethod(lambda cls, v: duration_s(v)))


class ScheduleSettings(_Model):
    every: float

    _every = field_validator("every", mode="before")(classmethod(lambda cls, v: duration_s(v)))

    @field_validator("every")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("every must be > 0, e.g. 7d")
        return v


class TriggerSettings(_Model):
    poll_interval_s: float = Field(default=60, gt=0)
    model_swap: bool = True
    engine_upgrade: bool = True
    gpu_change: bool = True
    workload_drift: DriftSettings | None = DriftSettings()
    production_oom: bool = True
    schedule: ScheduleSettings | None = None

    _poll = field_validator("poll_interval_s", mode="before")(classmethod(lambda cls, v: duration_s(v)))


class TuneSettings(_Model):
    trials: int = Field(default=20, ge=1)
    timeout: str | None = "2h"
    confirm: str = "3x3"
    soak: str = "10m"
    policy: str = "knee"
    twin: bool = Field(default=TWIN_FIRST, description=(
        "twin-first search (docs/twin.md): the cycle measures only the finalists of a simulator calibrated "
        "on this box, production's served window from /metrics included, so a re-tune drains production "
        "for fewer engine runs; where the simulator cannot stand for the box (no preset for its GPUs, a "
        "recorded workload) the cycle searches as without it. false: the sampler's search only"))

    @field_validator("timeout", "soak", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        if v is not None:
            duration_s(v)
            return str(v)
        return v

    @field_validator("confirm")
    @classmethod
    def _confirm(cls, v: str) -> str:
        from autotuner.trust.commands import parse_confirm

        if parse_confirm(v).top == 0:
            raise ValueError("confirm 0 would deploy an unconfirmed winner; the daemon confirms before any "
                             "rollout: use e.g. 3x3")
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from autotuner.analysis.candidates import POLICIES

        if v not in POLICIES:
            raise ValueError(f"policy {v!r}: use one of {', '.join(POLICIES)}")
        return v

    @property
    def timeout_s(self) -> float | None:
        return None if self.timeout is None else duration_s(self.timeout)

    @property
    def soak_s(self) -> float:
        return duration_s(self.soak)


class ListenSettings(_Model):
    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: int = Field(default=8765, ge=0, le=65535)
    token_env: str = Field(default="AUTOTUNER_DAEMON_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class FleetSettings(_Model):
    """Daemons on several boxes sharing this config's `storage:` (PostgreSQL): boxes with the same model, GPUs,
    engine and workload form a group; one tunes, the others adopt its winner, a canary first."""

    box: str = Field(default_factory=socket.gethostname, min_length=1, max_length=255,
                     pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="this box's name in the fleet")
    lease_s: float = Field(default=600, gt=0, description="a tuner's claim runs out this long after its last "
                           "renewal (it renews every third of it): a box that died mid-tune is taken over then")
    canary_healthy_s: float = Field(default=1800, ge=0, description="how long the canary serves the group's "
                                    "winner healthily before the other boxes adopt it")
    soak_s: float = Field(default=300, ge=0, description="after adopting, each box verifies its production again "
                          "and again for this long (a short soak on its own hardware) before it counts as adopted")

    _durations = field_validator("lease_s", "canary_healthy_s", "soak_s", mode="before")(
        classmethod(lambda cls, v: duration_s(v)))


class DaemonConfig(_Model):
    scenario: Path
    storage: str | None = None
    production: ProductionSettings
    deploy: DeploySpec
    triggers: TriggerSettings = TriggerSettings()
    window: str | None = None
    min_interval_s: float = Field(default=3600, ge=0)
    max_downtime: str | None = Field(default="30m", description="the most a cycle may keep production down "
                                     "(tune, confirm, soak and the restart): trials and the soak are planned "
                                     "to fit, and the cycle stops early with the best verified so far")
    approve: str = Field(default="auto", pattern=r"^(auto|manual)$",
                         description="manual: a cycle stops at `proposed` with its evidence until "
                                     "`autotuner daemon approve CONFIG CYCLE` (or `reject`)")
    tune: TuneSettings = TuneSettings()
    listen: ListenSettings = ListenSettings()
    notify: NotifySettings | None = Field(default=None, description="a webhook told of cycle ends, rollbacks, "
                                          "emergency mitigations and production going down or up")
    fleet: FleetSettings | None = None
    source: Path | None = Field(default=None, exclude=True)

    _min_interval = field_validator("min_interval_s", mode="before")(classmethod(lambda cls, v: duration_s(v)))

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            Window.parse(v)
        return v

    @field_validator("max_downtime", mode="before")
    @classmethod
    def _max_downtime(cls, v: Any) -> Any:
        if v is not None:
            if duration_s(v) <= 0:
                raise ValueError("max_downtime must be > 0 (e.g. 30m), or null for no bound")
            return str(v)
        return v

    @property
    def max_downtime_s(self) -> float | None:
        return None if self.max_downtime is None else duration_s(self.max_downtime)

    @property
    def schedule_window(self) -> Window | None:
        return None if self.window is None else Window.parse(self.window)

    def resolve(self, path: Path) -> Path:
        path = path.expanduser()
        return path if path.is_absolute() or self.source is None else self.source.parent / path

    @property
    def scenario_path(self) -> Path:
        return self.resolve(self.scenario)

    def storage_url(self, scenario_storage: str | None = None) -> str:
        """The study database: as given here (a relative SQLite path is relative to this file), else the
        scenario's `storage:` (relative to the scenario file), else $AUTOTUNER_HOME/autotuner.db."""
        storage, base = self.storage, self.source
        if storage is None and scenario_storage is not None:
            storage, base = scenario_storage, self.scenario_path
        if storage is None:
            from autotuner.engine.registry import autotuner_home

            return str(autotuner_home() / "autotuner.db")
        if "://" in storage:
            from autotuner.env_references import expand

            return expand(storage)  # a password only via ${VAR}, looked up now
        path = Path(storage).expanduser()
        return str(path if path.is_absolute() or base is None else base.parent / path)


def _tag(exc: ValidationError) -> str | None:
    """The deploy kind pydantic puts in an error's location (`deploy.command.start`), not a key of the file."""
    loc = exc.errors()[0]["loc"]
    return str(loc[1]) if len(loc) > 2 and loc[0] == "deploy" and loc[1] in KINDS else None


@dataclass(frozen=True)
class LoadedConfig:
    config: DaemonConfig
    scenario: Scenario

    @property
    def storage_url(self) -> str:
        """The daemon's `storage:`, else the scenario's when its file sets one, else the default."""
        given = self.scenario.storage if "storage" in self.scenario.model_fields_set else None
        return self.config.storage_url(given)


def load_config(path: str | Path) -> LoadedConfig:
    """The config and its scenario, both validated; DaemonConfigError (or ScenarioError) otherwise."""
    path = Path(path)
    data, node = load_mapping(path, DaemonConfigError, "daemon config file",
                              "a daemon config is a mapping with at least scenario, production and deploy")
    try:
        # Relative paths of the deploy section are relative to this file, as the scenario's are.
        config = DaemonConfig.model_validate({**data, "source": path.resolve()},
                                             context={"base_dir": path.resolve().parent})
    except ValidationError as exc:
        tag = _tag(exc)
        raise DaemonConfigError(first_error(exc, path, lambda loc: line_of(node, tuple(p for p in loc if p != tag)))
                                .replace(f": deploy.{_tag(exc)}.", ": deploy.", 1)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise DaemonConfigError(f"{path}: cannot be read as a daemon config: {exc}") from None
    try:
        storage = config.storage_url()
    except ValueError as exc:
        raise DaemonConfigError(f"{path}:{line_of(node, ('storage',))}: storage: {exc}") from None
    scenario_path = config.scenario_path
    if not scenario_path.is_file():
        raise DaemonConfigError(f"{path}:{line_of(node, ('scenario',))}: scenario: no such scenario file "
                                f"{scenario_path}")
    del storage
    _check_listen(config.listen, path, line_of(node, ("listen", "host")))
    return LoadedConfig(config, load_scenario(scenario_path))


def _check_listen(listen: ListenSettings, path: Path, line: int | None) -> None:
    """An address this box cannot listen on is bad input now, before the database is opened (the endpoint
    itself starts after it). Port 0: only the address is tried, the configured port may be busy until the
    old daemon exits."""
    try:
        infos = socket.getaddrinfo(listen.host, 0, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(address)
    except (OSError, UnicodeError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise DaemonConfigError(f"{path}:{line}: listen.host: cannot listen on {quoted(listen.host, 60)} "
                                f"({reason}): use an address of this box, e.g. 127.0.0.1") from None
