"""What a workload is, as plain frozen dataclasses (the scenario file's pydantic models convert into
these).

Time convention: every duration and rate in a spec is in ENGINE seconds — what the workload would be
against the real deployment. `Arrivals.time_scale` (engine seconds per wall second; the simulator's
speed-up, 1 for a real engine) compresses the schedule: gaps, burst intervals and `max_duration_s`
are divided by it on the wall clock. `request_timeout_s` is the exception: it guards against a hung
server, whose hang does not speed up with the simulator, so it stays in wall seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotuner.errors import UserInputError

LengthKind = Literal["fixed", "uniform", "normal", "lognormal"]
ArrivalKind = Literal["concurrency", "poisson", "trace", "burst"]
Api = Literal["completions", "chat"]


class WorkloadError(UserInputError, ValueError):
    """A workload that cannot be built (bad spec values, unreadable or invalid trace). Exit code 2."""


@dataclass(frozen=True)
class LengthDist:
    """A token-count distribution; every sample is clamped to [min, max] and to at least 1."""

    kind: LengthKind
    value: int | None = None  # fixed
    low: int | None = None  # uniform, inclusive
    high: int | None = None
    mean: float | None = None  # normal
    stddev: float | None = None
    median: float | None = None  # lognormal: exp(mu) = median
    sigma: float | None = None
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "stddev"),
                "lognormal": ("median", "sigma")}.get(self.kind)
        if need is None:
            raise WorkloadError(f"length distribution kind {self.kind!r} is not one of "
                                "fixed, uniform, normal, lognormal")
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise WorkloadError(f"a {self.kind} length distribution needs {', '.join(missing)}")
        if self.kind == "uniform" and self.low is not None and self.high is not None and self.low > self.high:
            raise WorkloadError(f"uniform length: low ({self.low}) > high ({self.high})")
        if (self.stddev or 0) < 0 or (self.sigma or 0) < 0:
            raise WorkloadError("length distribution spread (stddev, sigma) must be ≥ 0")
        if self.kind == "lognormal" and (self.median or 0) <= 0:
            raise WorkloadError("lognormal length: median must be > 0")
        if self.max is not None and self.max < max(1, self.min):
            raise WorkloadError(f"length distribution: max ({self.max}) < min ({self.min})")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            raw = float(self.value or 0)
        elif self.kind == "uniform":
            raw = float(rng.randint(int(self.low or 0), int(self.high or 0)))
        elif self.kind == "normal":
            raw = rng.gauss(float(self.mean or 0), float(self.stddev or 0))
        else:
            raw = rng.lognormvariate(math.log(float(self.median or 1)), float(self.sigma or 0))
        n = max(1, self.min, round(raw))
        return n if self.max is None else min(n, self.max)


@dataclass(frozen=True)
class SyntheticRequests:
    count: int
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    shared_prefix_tokens: int = 0
    shared_prefix_fraction: float = 0.0
    api: Api = "completions"
    # Lengths of the first measured prompts, each once (the prompts that crashed production); the rest are
    # drawn from `prompt_tokens`.
    include_prompt_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1:
            raise WorkloadError(f"synthetic request count must be ≥ 1, got {self.count}")
        if any(n < 1 for n in self.include_prompt_tokens):
            raise WorkloadError(f"include_prompt_tokens must all be ≥ 1, got {list(self.include_prompt_tokens)}")
        if not 0.0 <= self.shared_prefix_fraction <= 1.0:
            raise WorkloadError("shared_prefix_fraction must be between 0 and 1")
        if self.shared_prefix_tokens < 0:
            raise WorkloadError("shared_prefix_tokens must be ≥ 0")
        if self.api not in ("completions", "chat"):
            raise WorkloadError(f"api {self.api!r} is not one of completions, chat")


    @property
    def measured(self) -> int:
        """Measured requests: `count`, grown to hold every included length. Growing rather than refusing:
        the daemon fills the list from a crash dump whose size it does not choose (up to max-num-seqs
        requests), and a re-tune that dropped some of the prompts that crashed production would certify a
        config against less than what killed it."""
        return max(self.count, len(self.include_prompt_tokens))


def replay_first(lengths: Sequence[int], draw: Callable[[random.Random], int]) -> Callable[[random.Random], int]:
    """A length sampler that answers `lengths` in order, then draws. It draws for the included ones too
    (and drops the draw), so the requests after them get the lengths they would have had without them."""
    queue = list(lengths)

    def sample(rng: random.Random) -> int:
        drawn = draw(rng)
        return queue.pop(0) if queue else drawn

    return sample


@dataclass(frozen=True)
class TraceRequests:
    """A JSONL file: one request per line (`prompt` or `messages`, `max_tokens`, optional `arrival_s`)."""

    path: Path


@dataclass(frozen=True)
class Arrivals:
    kind: ArrivalKind
    concurrency: int = 8  # closed loop: workers; also the warm-up's parallelism
    rate: float | None = None  # poisson: requests per engine second
    time_scale: float = 1.0  # engine seconds per wall second (the simulator's speed-up)
    burst_size: int | None = None
    burst_interval_s: float | None = None  # engine seconds between burst starts

    def __post_init__(self) -> None:
        if self.kind not in ("concurrency", "poisson", "trace", "burst"):
            raise WorkloadError(f"arrival kind {self.kind!r} is not one of concurrency, poisson, trace, burst")
        if self.concurrency < 1:
            raise WorkloadError(f"concurrency must be ≥ 1, got {self.concurrency}")
        if self.time_scale <= 0:
            raise WorkloadError(f"time_scale must be > 0, got {self.time_scale}")
        if self.kind == "poisson" and (self.rate is None or self.rate <= 0):
            raise WorkloadError("poisson arrivals need a rate > 0 (requests per second)")
        if self.kind == "burst" and (not self.burst_size or self.burst_size < 1
                                     or self.burst_interval_s is None or self.burst_interval_s < 0):
            raise WorkloadError("burst arrivals need burst_size ≥ 1 and burst_interval_s ≥ 0")


@dataclass(frozen=True)
class WorkloadSpec:
    requests: SyntheticRequests | TraceRequests
    arrivals: Arrivals
    warmup_requests: int = 0  # sent first, excluded from metrics; synthetic: extra to `count`
    max_requests: int | None = None  # cap on measured requests sent
    max_duration_s: float | None = None  # engine seconds after which no new request is sent
    seed: int = 0
    ignore_eos: bool = True
    request_timeout_s: float = 600.0  # wall seconds, per request, whole stream

    def __post_init__(self) -> None:
        if self.warmup_requests < 0:
            raise WorkloadError("warmup_requests must be ≥ 0")
        if self.max_requests is not None and self.max_requests < 1:
            raise WorkloadError("max_requests must be ≥ 1")
        if self.max_duration_s is not None and self.max_duration_s <= 0:
            raise WorkloadError("max_duration_s must be > 0")
        if self.request_timeout_s <= 0:
            raise WorkloadError("request_timeout_s must be > 0")
