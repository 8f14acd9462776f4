"""Per-request results → the figures a trial is scored on. Pure functions.

`time_scale` turns wall seconds into engine seconds: against the simulator running X times faster
than the hardware it simulates, a measured 0.01 s TTFT is 0.01·X s on that hardware and a measured
1000 tok/s is 1000/X tok/s. It is 1 for real engines.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotuner.stats import percentile
from autotuner.workload.client import RequestResult

SUMMARY_KEYS = (
    "output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p90_s",
    "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "itl_p99_s", "e2e_p95_s", "completed", "failed",
    "prompt_tokens", "output_tokens", "duration_s", "queue_p95_s",
)  # fmt: skip


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def summarize(results: Sequence[RequestResult], duration_s: float | None = None,
              time_scale: float = 1.0) -> dict[str, float | int | None]:
    """`results`: the measured (non-warm-up) requests. Throughput is over the span from the first
    send to the last completion of a successful request; `duration_s` (wall seconds, e.g. the
    replay's) stands in only when no request completed. Latency keys are None when nothing was
    measured."""
    ok = [r for r in results if r.ok]
    sends = [r.sent_at for r in results if r.sent_at is not None]
    span = None
    if ok and sends:
        span = max(r.finished_at for r in ok) - min(sends)
    if span is None or span <= 0:
        span = duration_s
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)

    def rate(amount: float) -> float | None:
        return amount / (span * time_scale) if span else None

    ttfts = [t for r in ok if (t := r.ttft_s) is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    itls = [gap for r in ok for gap in r.itl_s]
    e2es = [t for r in ok if (t := r.e2e_s) is not None]
    queues = [q for r in results if (q := r.queue_s) is not None]
    return {
        "output_tokens_per_s": rate(output_tokens) if ok else 0.0,
        "total_tokens_per_s": rate(prompt_tokens + output_tokens) if ok else 0.0,
        "requests_per_s": rate(len(ok)) if ok else 0.0,
        "ttft_p50_s": _scaled(percentile(ttfts, 50), time_scale),
        "ttft_p90_s": _scaled(percentile(ttfts, 90), time_scale),
        "ttft_p95_s": _scaled(percentile(ttfts, 95), time_scale),
        "ttft_p99_s": _scaled(percentile(ttfts, 99), time_scale),
        "tpot_p50_s": _scaled(percentile(tpots, 50), time_scale),
        "itl_p99_s": _scaled(percentile(itls, 99), time_scale),
        "e2e_p95_s": _scaled(percentile(e2es, 95), time_scale),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "duration_s": _scaled(span, time_scale),
        "queue_p95_s": _scaled(percentile(queues, 95), time_scale),
    }
