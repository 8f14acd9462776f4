"""What the watcher reads from a production vLLM at one instant."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LengthHistogram:
    """One Prometheus histogram summed over its label sets: cumulative buckets, +Inf last."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending, +Inf last
    count: float
    sum: float

    def as_dict(self) -> dict[str, Any]:
        """As JSON holds it: the last bucket's bound is "+Inf", as in the Prometheus text (JSON has no infinity)."""
        return {"buckets": [["+Inf" if math.isinf(le) else le, c] for le, c in self.buckets], "count": self.count,
                "sum": self.sum}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LengthHistogram:
        return cls(tuple((float(le), float(c)) for le, c in data["buckets"]), float(data["count"]),
                   float(data["sum"]))

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float, upper: float | None = None) -> float | None:
        """Like PromQL's histogram_quantile: linear inside the bucket holding rank q × count, the first
        bucket starting at 0. None when empty.

        The +Inf bucket has no upper edge: PromQL answers it with the highest finite bound, which reads
        every prompt above vLLM's last bucket (5000 for an 8192 context) as 5000. With `upper` (the served
        max_model_len, which no prompt can exceed) it is a bucket like the others, (top bound, upper], and
        is interpolated linearly too: the histogram says nothing more about where inside it they fall, so
        linear is the same guess PromQL makes in every finite bucket."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is outside [0, 1]")
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > lower_count:
                top = le
                if math.isinf(le):
                    if upper is None or upper <= lower_bound:
                        return lower_bound
                    top = float(upper)
                return lower_bound + (top - lower_bound) * (rank - lower_count) / (cumulative - lower_count)
            if not math.isinf(le):
                lower_bound = le
            lower_count = cumulative
        return lower_bound

    def since(self, earlier: LengthHistogram) -> LengthHistogram:
        """The requests observed after `earlier` was taken. A counter that went down (the engine restarted)
        or a changed bucket layout means `earlier` no longer applies: everything now is the window."""
        before = dict(earlier.buckets)
        if self.count < earlier.count or [le for le, _ in self.buckets] != [le for le, _ in earlier.buckets]:
            return self
        if any(c < before[le] for le, c in self.buckets):
            return self
        return LengthHistogram(tuple((le, c - before[le]) for le, c in self.buckets),
                               self.count - earlier.count, self.sum - earlier.sum)

    def bucket_width_at(self, value: float) -> float:
        """Width of the bucket `value` falls into (the resolution a quantile has there); inf in +Inf."""
        lower = 0.0
        for le, _ in self.buckets:
            if value <= le:
                return le - lower
            lower = le
        return math.inf


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_mib: int


@dataclass(frozen=True)
class ProductionSnapshot:
    taken_at: float  # time.time()
    endpoint: str
    reachable: bool
    error: str | None  # why not reachable / what failed; never a secret
    served_model: str | None  # /v1/models data[0].id
    root: str | None  # /v1/models data[0].root
    max_model_len: int | None  # /v1/models data[0].max_model_len
    vllm_version: str | None  # /version
    model_fingerprint: str | None
    prompt_tokens: LengthHistogram | None  # vllm:request_prompt_tokens
    generation_tokens: LengthHistogram | None  # vllm:request_generation_tokens
    kv_cache_usage: float | None  # 0..1
    preemptions_total: float | None
    requests_running: float | None
    # `autotuner sim serve` says so in /version (its GPU preset, box size, speed-up); None for a real vLLM.
    simulator: dict[str, object] | None = None
    # What production's requests saw, in seconds (vllm:time_to_first_token_seconds and
    # vllm:inter_token_latency_seconds): with the lengths above, the twin's calibration with no downtime.
    ttft_s: LengthHistogram | None = None
    itl_s: LengthHistogram | None = None
