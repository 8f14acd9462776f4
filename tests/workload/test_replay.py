"""Arrival schedules and the replayer, timed against a fake streaming server."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import httpx
import pytest

from autotuner.workload.arrivals import send_offsets
from autotuner.workload.client import StreamingClient
from autotuner.workload.replay import Replayer, replay
from autotuner.workload.spec import Arrivals, WorkloadError
from tests.support.fake_openai import Recorder, simple_stream, sse_response
from tests.support.replay import paced, reqs, spec

# --- schedules ---------------------------------------------------------------------------------

def test_poisson_offsets_have_the_asked_mean_rate_and_are_seeded() -> None:
    offsets = send_offsets(Arrivals("poisson", rate=50.0), reqs(4000), seed=7)
    assert offsets is not None and offsets[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(offsets))
    rate = (len(offsets) - 1) / offsets[-1]
    assert 50 * 0.95 < rate < 50 * 1.05
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    # Exponential gaps: standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.08)
    assert send_offsets(Arrivals("poisson", rate=50.0), reqs(4000), seed=7) == offsets
    assert send_offsets(Arrivals("poisson", rate=50.0), reqs(4000), seed=8) != offsets
    fast = send_offsets(Arrivals("poisson", rate=50.0, time_scale=10), reqs(4000), seed=7)
    assert fast is not None and fast[-1] == pytest.approx(offsets[-1] / 10)


def test_burst_and_trace_offsets_are_scaled_to_wall_time() -> None:
    burst = send_offsets(Arrivals("burst", burst_size=3, burst_interval_s=2.0, time_scale=4), reqs(7))
    assert burst == [0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0]
    trace = send_offsets(Arrivals("trace", time_scale=2), reqs(3, [10.0, 11.0, 14.0]))
    assert trace == [0.0, 0.5, 2.0]
    assert send_offsets(Arrivals("concurrency"), reqs(3)) is None
    with pytest.raises(WorkloadError, match="request 1 has no arrival_s"):
        send_offsets(Arrivals("trace"), [*reqs(1, [0.0]), *reqs(1)])


@pytest.mark.parametrize("bad", [
    {"kind": "poisson"}, {"kind": "burst", "burst_size": 2}, {"kind": "concurrency", "concurrency": 0},
    {"kind": "concurrency", "time_scale": 0}, {"kind": "ramp"},
])  # fmt: skip
def test_arrivals_validation(bad: dict[str, object]) -> None:
    with pytest.raises(WorkloadError):
        Arrivals(**bad)  # type: ignore[arg-type]


# --- replay against a paced fake server ----------------------------------------------------------

async def test_closed_loop_never_exceeds_the_concurrency_and_uses_all_of_it() -> None:
    rec = paced(tokens=4, gap_s=0.005, first_s=0.01)
    async with rec.client() as http:
        client = StreamingClient(http, "http://e", "m")
        result = await replay(spec(Arrivals("concurrency", concurrency=5)), reqs(40), client)
    assert rec.max_in_flight == 5
    assert len(result.results) == 40 and all(r.ok for r in result.results)
    # 40 requests of ≥ 25 ms, 5 at a time: at least 8 rounds (how fast is for benchmarks; that they ran
    # 5 at a time is max_in_flight above).
    assert result.duration_s > 0.15
    assert [r.target_prompt_tokens for r in result.results] == [None] * 40


async def test_poisson_replay_sends_at_the_scheduled_rate() -> None:
    rec = paced(tokens=2, gap_s=0.001, first_s=0.002)
    async with rec.client() as http:
        result = await replay(spec(Arrivals("poisson", rate=20.0, time_scale=2), seed=3), reqs(60),
                              StreamingClient(http, "http://e", "m"))
    offsets = send_offsets(Arrivals("poisson", rate=20.0, time_scale=2), reqs(60), seed=3)
    assert offsets is not None
    # 20/s engine time at time_scale 2 → 40/s wall. A loaded 2-core box delays sends, it must never
    # hurry them (speed belongs in benchmarks, not in tests).
    assert 30 < (len(offsets) - 1) / offsets[-1] < 55  # the seeded schedule itself
    sent = sorted(r.sent_at for r in result.results if r.sent_at is not None)
    assert len(sent) == 60 and sent[-1] - sent[0] >= offsets[-1] - 0.002
    # Each request left when it was due (never before), give or take a loaded event loop's delay.
    lag = [r.sent_at - (result.start + off) for r, off in zip(result.results, offsets, strict=True)]
    assert min(lag) >= -0.001 and statistics.median(lag) < 0.25
    assert result.time_scale == 2


async def test_bursts_arrive_together_then_wait_for_the_interval() -> None:
    rec = paced(tokens=2, gap_s=0.001, first_s=0.002)
    async with rec.client() as http:
        await replay(spec(Arrivals("burst", burst_size=4, burst_interval_s=0.5)), reqs(12),
                     StreamingClient(http, "http://e", "m"))
    t = [a - rec.arrivals[0] for a in rec.arrivals]
    groups = [t[0:4], t[4:8], t[8:12]]
    for i, group in enumerate(groups):
        # A burst leaves together: well within the interval even when a loaded box delays sends.
        assert max(group) - min(group) < 0.3
        assert min(group) >= 0.5 * i - 0.002  # and never before its time
    for earlier, later in itertools.pairwise(groups):
        assert min(later) - min(earlier) >= 0.5 - 0.004


async def test_trace_replay_follows_timestamps() -> None:
    rec = paced(tokens=2, gap_s=0.001, first_s=0.002)
    trace = reqs(4, [5.0, 5.2, 5.2, 5.8])
    async with rec.client() as http:
        result = await replay(spec(Arrivals("trace", time_scale=2)), trace, StreamingClient(http, "http://e", "m"))
    # When each left, from the replay's start: never before its time, and (with margins a loaded box keeps)
    # at the trace's gaps divided by the time scale, not at the trace's own seconds.
    t = [r.sent_at - result.start for r in result.results if r.sent_at is not None]
    for got, want in zip(t, [0.0, 0.1, 0.1, 0.4], strict=True):
        assert want - 0.002 <= got < want + 0.25


async def test_warmup_runs_first_and_is_kept_apart() -> None:
    rec = paced(tokens=3, gap_s=0.005, first_s=0.01)
    async with rec.client() as http:
        result = await replay(spec(Arrivals("poisson", rate=100.0), warmup_requests=3), reqs(10),
                              StreamingClient(http, "http://e", "m"))
    assert len(result.warmup) == 3 and len(result.results) == 7
    assert [b["prompt"] for b in rec.bodies[:3]] == ["p0", "p1", "p2"]
    assert max(r.finished_at for r in result.warmup) <= min(r.sent_at for r in result.results)  # type: ignore[type-var]
    assert result.start >= max(r.finished_at for r in result.warmup)


async def test_request_cap_and_duration_cap() -> None:
    rec = paced(tokens=2, gap_s=0.001, first_s=0.002)
    async with rec.client() as http:
        client = StreamingClient(http, "http://e", "m")
        capped = await replay(spec(Arrivals("concurrency", concurrency=2), max_requests=5), reqs(20), client)
        assert len(capped.results) == 5 and capped.not_sent == 0

        slow = Recorder(lambda _: sse_response(simple_stream(3, gap_s=0.02, first_s=0.03)))  # ~70 ms each
    async with slow.client() as http:
        client = StreamingClient(http, "http://e", "m")
        # 0.5 engine seconds at time_scale 2 → no new request after 0.25 s of wall time.
        result = await replay(spec(Arrivals("concurrency", concurrency=2, time_scale=2), max_duration_s=0.5),
                              reqs(40), client)
    assert 4 <= len(result.results) <= 10 and result.not_sent == 40 - len(result.results)
    assert all(r.sent_at is not None and r.sent_at - result.start < 0.25 for r in result.results)
    assert all(r.ok for r in result.results)  # in flight at the deadline: finished, not dropped
    assert result.duration_s > 0.25


@pytest.mark.parametrize("arrivals", [
    Arrivals("concurrency", concurrency=3), Arrivals("burst", burst_size=3, burst_interval_s=100.0),
])  # fmt: skip
async def test_cancelling_a_replay_records_in_flight_requests_as_cancelled(arrivals: Arrivals) -> None:
    rec = Recorder(lambda _: sse_response(simple_stream(3, gap_s=5.0, first_s=0.01)))
    async with rec.client() as http:
        client = StreamingClient(http, "http://e", "m")
        replayer = Replayer(spec(arrivals), reqs(10), client)
        task = asyncio.ensure_future(replayer.run())
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.perf_counter() - t0 < 1.0  # not waiting for the streams (5 s between tokens)
    result = replayer.result()
    assert result.cancelled and len(result.results) == 3 and result.not_sent == 7
    assert all(not r.ok and r.error == "cancelled" for r in result.results)
    assert rec.in_flight == 0  # the streams were closed, not left dangling


async def test_replay_with_an_unreachable_server_finishes_with_failures() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        result = await replay(spec(Arrivals("poisson", rate=1000.0)), reqs(5), StreamingClient(http, "http://e", "m"))
    assert len(result.results) == 5 and all(r.error == "connect error: refused" for r in result.results)
