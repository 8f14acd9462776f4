"""A trial's measured phase, once its engine is ready: warm up, replay the workload while polling
/metrics for the KV-cache peak, stop early when the engine dies, the OOM threshold trips, the trial is
aborted or the pruner says it is hopeless, then summarise what the requests measured.

Apart from the lifecycle (lifecycle.py: start, watch, stop and release): this is the part that talks
HTTP to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from autotuner.engine.launch import LaunchPlan
from autotuner.engine.process import EngineProcess
from autotuner.scenario import Scenario
from autotuner.trials.outcomes import Outcome
from autotuner.trials.result import Phase, TrialResult
from autotuner.tuner import pruning
from autotuner.tuner.trial_tasks import cancel
from autotuner.workload import prometheus
from autotuner.workload.client import StreamingClient, http_client, shard_count
from autotuner.workload.replay import CANCELLED, Replayer
from autotuner.workload.requests import build_requests
from autotuner.workload.summary import summarize

# /metrics polling during the replay, for the KV-cache usage peak (wall seconds).
METRICS_POLL_S = 0.5  # of engine time: a simulator at speed-up N is polled N times as often (down to the floor)
METRICS_POLL_FLOOR_S = 0.1


async def serve_and_replay(scenario: Scenario, plan: LaunchPlan, engine: EngineProcess, result: TrialResult,
                           tripped: asyncio.Event, aborted: asyncio.Event, phase: Phase,
                           pruner: pruning.Pruner | None, replay: int = 0) -> None:
    api_key = plan.env.get("VLLM_API_KEY")
    async with http_client() as http, contextlib.AsyncExitStack() as shards:
        time_scale = await _time_scale(http, plan.base_url)
        result.time_scale = time_scale
        spec = scenario.workload.to_spec(scenario.source.parent if scenario.source else None, time_scale)
        phase("warm-up")
        # The k-th workload on this engine: prompts of their own (its prefix cache holds the earlier ones').
        request_set = await build_requests(spec, http, plan.base_url, plan.served_name, api_key, replay=replay)
        result.warnings += request_set.warnings
        extra = [await shards.enter_async_context(http_client())
                 for _ in range(shard_count(peak_concurrency(scenario)) - 1)]
        client = StreamingClient(http, plan.base_url, plan.served_name, api_key, ignore_eos=spec.ignore_eos,
                                 timeout_s=spec.request_timeout_s, extra=extra)
        before = await _scrape(http, plan.base_url)
        replayer = Replayer(spec, request_set.requests, client)
        stop_poll = asyncio.Event()
        snapshots: list[prometheus.Snapshot] = []
        # KV usage is a gauge: its peak is seen only if a scrape lands while the run is busy, and a sped-up
        # simulator's whole replay can be shorter than one engine-time interval.
        poll_s = max(METRICS_POLL_S / time_scale, METRICS_POLL_FLOOR_S)
        poller = asyncio.ensure_future(prometheus.poll(http, plan.base_url, poll_s, stop_poll, snapshots))
        run = died = trip = stop = prune = None
        pruned: str | None = None
        try:
            phase("replay")
            run = asyncio.ensure_future(replayer.run())
            died = asyncio.ensure_future(_watch_exit(engine))
            trip = asyncio.ensure_future(tripped.wait())
            stop = asyncio.ensure_future(aborted.wait())
            prune = asyncio.ensure_future(pruning.watch(replayer, pruner)) if pruner is not None else None
            await asyncio.wait({run, died, trip, stop, *([prune] if prune else [])},
                               return_when=asyncio.FIRST_COMPLETED)
            pruned = prune.result() if prune is not None and prune.done() and not prune.cancelled() else None
            await cancel(run, died, trip, stop, prune)
            replay = replayer.result()
            after = await _scrape(http, plan.base_url)
            stop_poll.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(poller), timeout=5)
        finally:
            # Also when we are cancelled: no replay, poll or watch task outlives the trial.
            await cancel(run, died, trip, stop, prune, poller)
    results = replay.results
    if pruned is not None:
        # Stopped on purpose: the requests cut short are not failures of the configuration.
        results = [r for r in results if r.error != CANCELLED]
        result.outcome, result.reason = Outcome.PRUNED, pruned
    result.metrics = summarize(results, replay.duration_s, time_scale)
    if pruned is not None:
        result.metrics["partial_of"] = len(replay.results) + replay.not_sent
    if before is not None and after is not None:
        d = prometheus.delta(before, after)
        result.engine["preemptions"] = int(d.preemptions)
    kv_peak = prometheus.peak([s for s in (before, *snapshots, after) if s is not None])
    result.engine["kv_cache_usage_max"] = kv_peak
    failed = [r for r in results if not r.ok]
    if failed and not result.reason:
        result.reason = f"{len(failed)} request(s) failed, first: {failed[0].error}"


def peak_concurrency(scenario: Scenario) -> int:
    """Streams the replay may hold open at once (open-loop arrivals: a guess from the request count)."""
    arrivals = scenario.workload.arrivals
    if arrivals.kind == "concurrency":
        return arrivals.concurrency
    if arrivals.kind == "burst" and arrivals.burst_size:
        return arrivals.burst_size
    return min(scenario.workload.requests.count, 64)


async def _watch_exit(engine: EngineProcess) -> None:
    """Returns when the engine exits or its log says it died (a CUDA OOM can leave vLLM hanging)."""
    while engine.returncode is None and not engine.facts.fatal:
        await asyncio.sleep(0.05)


async def _scrape(http: httpx.AsyncClient, base_url: str) -> prometheus.Snapshot | None:
    try:
        return await prometheus.scrape(http, base_url)
    except prometheus.ScrapeError:
        return None


async def _time_scale(http: httpx.AsyncClient, base_url: str) -> float:
    """The simulator says how much faster than its simulated hardware it runs; a real engine is 1."""
    try:
        body = (await http.get(base_url + "/version", timeout=5)).json()
    except (httpx.HTTPError, ValueError):
        return 1.0
    sim = body.get("simulator") if isinstance(body, dict) else None
    return float(sim.get("speedup", 1.0)) if isinstance(sim, dict) else 1.0
