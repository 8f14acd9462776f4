"""When each measured request is due.

Open-loop schedules (Poisson, trace, bursts) are offsets in wall seconds from the start of the
measured phase: spec times are engine seconds, divided by `time_scale`. The closed loop (fixed
concurrency) has no offsets: a worker sends its next request when the previous one completes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import Arrivals, WorkloadError


def send_offsets(arrivals: Arrivals, requests: Sequence[RequestSpec], seed: int = 0) -> list[float] | None:
    """Wall-second offsets, one per request and non-decreasing in request order for generated
    schedules (a trace keeps its own order); None for the closed loop."""
    scale = arrivals.time_scale
    n = len(requests)
    if arrivals.kind == "concurrency":
        return None
    if arrivals.kind == "poisson":
        assert arrivals.rate is not None
        rng = random.Random(f"{seed}-arrivals")
        wall_rate = arrivals.rate * scale
        # The first request goes at once, as `vllm bench serve` sends it; then exponential gaps.
        gaps = [0.0] + [rng.expovariate(wall_rate) for _ in range(n - 1)]
        return list(itertools.accumulate(gaps))[:n]
    if arrivals.kind == "burst":
        assert arrivals.burst_size is not None and arrivals.burst_interval_s is not None
        return [(i // arrivals.burst_size) * arrivals.burst_interval_s / scale for i in range(n)]
    times = [r.arrival_s for r in requests]
    if any(t is None for t in times):
        missing = next(i for i, t in enumerate(times) if t is None)
        raise WorkloadError(f"trace arrivals: request {missing} has no arrival_s")
    known = [float(t) for t in times if t is not None]
    t0 = min(known, default=0.0)  # offsets from the first measured request (warm-ups are cut off)
    return [(t - t0) / scale for t in known]
