"""The scenario file: one tuning job, validated at load (pydantic at the boundary).

A bad file raises `ScenarioError` with one message naming the file, the line, the field and what is
allowed. Everything downstream receives plain, validated values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from autotuner.catalog.gpus import load_gpu
from autotuner.catalog.models import load_model
from autotuner.engine_kinds import KINDS
from autotuner.errors import ScenarioError, UserInputError, quoted
from autotuner.filelines import first_error, line_of, load_mapping
from autotuner.scenario.engine import EngineSettings, SimSettings
from autotuner.scenario.fields import (
    DAY_S,
    ENV_NAME,
    MAX_REQUESTS,
    MAX_TOKENS,
    NAME,
    RESERVED_FLAGS,
    Seconds,
    _Model,
)
from autotuner.secrets import display_url
from autotuner.vllm import FlagValue
from autotuner.workload.spec import (
    Arrivals,
    LengthDist,
    SyntheticRequests,
    TraceRequests,
    WorkloadSpec,
)
from autotuner.workload.trace import load_trace

__all__ = ["DAY_S", "ENV_NAME", "MAX_REQUESTS", "MAX_TOKENS", "NAME", "RESERVED_FLAGS", "EngineSettings",
           "Scenario", "SimSettings", "load_scenario"]


class LengthSettings(_Model):
    kind: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    low: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    high: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    mean: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    stddev: float | None = Field(default=None, ge=0, le=MAX_TOKENS)
    median: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    # exp(sigma) is the spread factor: at 10 one prompt in six is 22,000 times the median already; beyond,
    # the memory model's exp() overflows.
    sigma: float | None = Field(default=None, ge=0, le=10)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _complete(self) -> LengthSettings:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "stddev"),
                "lognormal": ("median", "sigma")}[self.kind]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {', '.join(need)} (missing {', '.join(missing)})")
        if self.kind == "uniform" and self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError("low must be ≤ high")
        if self.max is not None and self.max < self.min:
            raise ValueError("max must be ≥ min")
        return self


def _length(value: Any) -> Any:
    """`256` is shorthand for a fixed length, `3000-6000` for a uniform one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    if isinstance(value, str) and re.fullmatch(r"\d{1,9}-\d{1,9}", value):
        lo, hi = value.split("-")
        return {"kind": "uniform", "low": int(lo), "high": int(hi)}
    return value


class RequestSettings(_Model):
    kind: Literal["synthetic", "trace"] = "synthetic"
    count: int = Field(default=32, ge=1, le=MAX_REQUESTS)
    prompt_tokens: LengthSettings = LengthSettings(kind="uniform", low=3000, high=6000)
    output_tokens: LengthSettings = LengthSettings(kind="fixed", value=256)
    shared_prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    shared_prefix_fraction: float = Field(default=0.0, ge=0, le=1)
    api: Literal["completions", "chat"] = "completions"
    path: str | None = Field(default=None, description="JSONL trace, relative to the scenario file")
    include_prompt_tokens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=list, max_length=MAX_REQUESTS,
        description="prompt lengths replayed first, each once, then the distribution: the first measured "
        "requests (after the warm-up) have exactly these lengths, the rest are drawn from prompt_tokens as "
        "without it; a count smaller than the list grows to hold them all. The daemon sets it to the "
        "prompts of the step that crashed production (synthetic requests only)")

    _lengths = field_validator("prompt_tokens", "output_tokens", mode="before")(
        classmethod(lambda cls, v: _length(v)))

    @model_validator(mode="after")
    def _trace_path(self) -> RequestSettings:
        if self.kind == "trace" and not self.path:
            raise ValueError("kind trace needs path (a JSONL file)")
        if self.kind == "trace" and self.include_prompt_tokens:
            raise ValueError("include_prompt_tokens is for synthetic requests: a trace replays its own prompts "
                             "(add those requests to the trace instead)")
        return self


class ArrivalSettings(_Model):
    kind: Literal["concurrency", "poisson", "trace", "burst"] = "concurrency"
    concurrency: int = Field(default=8, ge=1, le=100_000)
    rate: float | None = Field(default=None, gt=0, le=1e6, description="requests per second (poisson)")
    time_scale: float = Field(default=1.0, gt=0, le=1e6)
    burst_size: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    burst_interval_s: Seconds | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _complete(self) -> ArrivalSettings:
        if self.kind == "poisson" and self.rate is None:
            raise ValueError("kind poisson needs rate (requests per second)")
        if self.kind == "burst" and (self.burst_size is None or self.burst_interval_s is None):
            raise ValueError("kind burst needs burst_size and burst_interval_s")
        return self


def _length_spec(settings: LengthSettings) -> LengthDist:
    return LengthDist(**settings.model_dump())


class WorkloadSettings(_Model):
    requests: RequestSettings = RequestSettings()
    arrivals: ArrivalSettings = ArrivalSettings()
    warmup_requests: int = Field(default=2, ge=0, le=MAX_REQUESTS)
    max_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    max_duration_s: Seconds | None = Field(default=None, gt=0)
    seed: int = Field(default=0, ge=-(2**63), lt=2**63)
    ignore_eos: bool = True
    request_timeout_s: Seconds = Field(default=600.0, gt=0)

    def to_spec(self, base_dir: Path | None, time_scale: float = 1.0) -> WorkloadSpec:
        r = self.requests
        requests: SyntheticRequests | TraceRequests
        if r.kind == "trace":
            path = Path(r.path or "")
            requests = TraceRequests(path if path.is_absolute() or base_dir is None else base_dir / path)
        else:
            requests = SyntheticRequests(r.count, _length_spec(r.prompt_tokens), _length_spec(r.output_tokens),
                                         r.shared_prefix_tokens, r.shared_prefix_fraction, r.api,
                                         tuple(r.include_prompt_tokens))
        a = self.arrivals
        arrivals = Arrivals(a.kind, a.concurrency, a.rate, a.time_scale * time_scale, a.burst_size,
                            a.burst_interval_s)
        return WorkloadSpec(requests, arrivals, self.warmup_requests, self.max_requests, self.max_duration_s,
                            self.seed, self.ignore_eos, self.request_timeout_s)


class MonitorSettings(_Model):
    kind: Literal["nvml", "sim", "host", "auto"] = "auto"
    hz: float = Field(default=100.0, gt=0, le=1000)
    # Other processes' memory per GPU (a desktop on GPU 0) a trial may run beside; above it, busy.
    foreign_allowance_mib: int = Field(default=1024, ge=0, le=2**40)


class OomThreshold(_Model):
    fraction: float | None = Field(default=0.97, gt=0, le=1)
    min_free_mib: int | None = Field(default=None, ge=0, le=2**40)

    @model_validator(mode="after")
    def _one(self) -> OomThreshold:
        if self.min_free_mib is not None and "fraction" not in self.model_fields_set:
            object.__setattr__(self, "fraction", None)
        if (self.fraction is None) == (self.min_free_mib is None):
            raise ValueError("give either fraction (of each GPU's total) or min_free_mib, not both")
        return self


class SearchParam(_Model):
    type: Literal["int", "float", "bool", "categorical"]
    low: float | None = None
    high: float | Literal["auto"] | None = None
    step: float | None = Field(default=None, gt=0)
    log: bool = False
    choices: list[FlagValue] | None = None

    @model_validator(mode="after")
    def _complete(self) -> SearchParam:
        if self.type in ("int", "float"):
            if self.low is None or self.high is None:
                raise ValueError(f"type {self.type} needs low and high")
            if self.high != "auto" and float(self.high) < self.low:
                raise ValueError("low must be ≤ high")
            if self.log and (self.step is not None or self.low <= 0):
                raise ValueError("log scale needs low > 0 and no step")
        if self.type == "categorical" and not self.choices:
            raise ValueError("type categorical needs a non-empty choices list")
        return self


Metric = Literal["output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p90_s",
                 "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s"]


class Objective(_Model):
    metric: Metric
    direction: Literal["maximize", "minimize"]


class BudgetSettings(_Model):
    trials: int = Field(default=30, ge=1, le=1_000_000)
    timeout: str | None = Field(default=None, description="e.g. 8h, 90m")

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, timeout: str | None) -> str | None:
        """Read now: a timeout the tuner cannot read is bad input before the database exists."""
        if timeout is not None:
            from autotuner.durations import parse_duration

            try:
                parse_duration(timeout)
            except UserInputError as exc:
                raise ValueError(str(exc)) from None
        return timeout


class Scenario(_Model):
    name: str = Field(default="scenario", pattern=NAME,
                      description="a file name (logs are kept under it): letters, digits, `_.-`, no leading `.`")
    engine: EngineSettings
    search_space: dict[str, SearchParam] | None = None
    workload: WorkloadSettings = WorkloadSettings()
    monitor: MonitorSettings = MonitorSettings()
    oom_threshold: OomThreshold = OomThreshold()
    objectives: list[Objective] = Field(default_factory=lambda: [
        Objective(metric="output_tokens_per_s", direction="maximize"),
        Objective(metric="ttft_p95_s", direction="minimize"),
    ], min_length=1)
    # A limit of 0 or below can never be met and the constraints divide by it: refused at load.
    slos: dict[Metric, Annotated[float, Field(gt=0, le=1e9)]] = Field(default_factory=dict)
    current_config: dict[str, FlagValue] = Field(default_factory=dict,
                                                 description="the flags deployed today, for the baseline")
    budget: BudgetSettings = BudgetSettings()
    storage: str = Field(default="sqlite:///autotuner.db", min_length=1, max_length=4096)
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, name: Any) -> Any:
        if isinstance(name, str) and not re.match(NAME, name):
            raise ValueError(f"{quoted(name, 60)} cannot name files: use 1-100 letters, digits, `_`, `.` or `-`, "
                             "not starting with `.` or `-` (the logs are kept under this name)")
        return name

    @field_serializer("storage")
    def _storage_as_stored(self, storage: str) -> str:
        return display_url(storage)  # a database password never travels with the scenario

    def sim_gpu(self) -> str:
        """The simulated GPU: a preset name, or its YAML file resolved against the scenario's folder."""
        gpu = self.engine.sim.gpu
        return str(self.resolve(gpu)) if gpu.endswith((".yaml", ".yml")) else gpu

    def tensor_parallel_size(self) -> int:
        tp = self.engine.flags.get("tensor-parallel-size", 1)
        return int(tp) if isinstance(tp, int | float | str) and str(tp).isdigit() else 1

    def sim_gpu_count(self) -> int:
        return self.engine.sim.gpus or self.tensor_parallel_size()

    def resolve(self, relative: str) -> Path:
        """A path from the scenario, relative to the scenario file's directory."""
        path = Path(relative).expanduser()
        if path.is_absolute() or self.source is None:
            return path
        return self.source.parent / path


# --- loading ----------------------------------------------------------------------------------------

def _model_from_scenario_folder(scenario: Scenario) -> Scenario:
    """A relative engine.model that is a directory next to the scenario file is that directory, wherever
    the command runs from (like the GPU and trace files); anything else (a hub name, a preset) is kept."""
    model = Path(scenario.engine.model).expanduser()
    if model.is_absolute() or scenario.source is None:
        return scenario
    local = scenario.resolve(scenario.engine.model)
    if not local.is_dir():
        return scenario
    return scenario.model_copy(update={"engine": scenario.engine.model_copy(update={"model": str(local)})})


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    data, node = load_mapping(path, ScenarioError, "scenario file",
                              "a scenario is a mapping with at least `engine: {model: ...}`")
    try:
        scenario = Scenario.model_validate({**data, "source": path.resolve()})
    except ValidationError as exc:
        raise ScenarioError(first_error(exc, path, lambda loc: line_of(node, loc))) from None
    except (ValueError, TypeError, RecursionError) as exc:  # what pydantic does not wrap (e.g. deep nesting)
        raise ScenarioError(f"{path}: cannot be read as a scenario: {exc}") from None
    scenario = _model_from_scenario_folder(scenario)
    if KINDS[scenario.engine.kind].simulated:
        # The simulated box and model are read now: a bad GPU file or config.json is bad input, refused
        # before anything is started or written (each error names its own file and line).
        load_gpu(scenario.sim_gpu())
        load_model(scenario.engine.model)
    if scenario.workload.requests.kind == "trace" and not KINDS[scenario.engine.kind].replays_traces:
        # Refused at load, not when the runner is built: by then the study database exists.
        raise ScenarioError(f"{path}:{line_of(node, ('engine', 'kind'))}: engine.kind: {scenario.engine.kind} "
                            "takes synthetic workloads only (token counts, no text); replay a trace with kind sim "
                            "or vllm")
    if scenario.workload.requests.kind == "trace":
        trace = scenario.resolve(scenario.workload.requests.path or "")
        line = line_of(node, ("workload", "requests", "path"))
        if not trace.is_file():
            raise ScenarioError(f"{path}:{line}: workload.requests.path: no such trace file {trace}")
        # Read now, so that a bad line is refused before anything starts (the error names trace:line).
        load_trace(trace, require_arrival=scenario.workload.arrivals.kind == "trace")
    return scenario
