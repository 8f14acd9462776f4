"""The whole workload path against the simulator as a real process over real HTTP."""

from __future__ import annotations

import statistics

import httpx

from autotuner.workload.client import StreamingClient, http_client
from autotuner.workload.replay import replay
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.requests import build_requests
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec
from autotuner.workload.summary import summarize

MODEL = "llama-2-13b"
SEED = [MODEL, "-tp", "8", "--max-model-len", "8192", "--sim-speedup", "100"]


def long_prompts(count: int, api: str = "completions", speedup: float = 100, **kw: object) -> WorkloadSpec:
    syn = SyntheticRequests(count, LengthDist("uniform", low=2000, high=7000), LengthDist("fixed", value=48),
                            api=api)  # type: ignore[arg-type]
    arrivals = Arrivals("concurrency", concurrency=8, time_scale=speedup)
    return WorkloadSpec(syn, arrivals, seed=11, **kw)  # type: ignore[arg-type]


async def test_eight_concurrent_long_prompts_land_on_their_token_counts(sim_server) -> None:
    server = sim_server.start(SEED)
    spec = long_prompts(24, warmup_requests=2)
    async with http_client() as http:
        built = await build_requests(spec, http, server.url, MODEL)
        result = await replay(spec, built.requests, StreamingClient(http, server.url, MODEL))
    assert built.tokenize_calls <= 10 and not built.warnings
    assert len(result.warmup) == 2 and len(result.results) == 24
    assert all(r.ok for r in result.results), [r.error for r in result.results if not r.ok]
    for r in result.results:
        assert r.prompt_tokens == r.target_prompt_tokens  # exact, per the server's own usage
        assert r.output_tokens == 48 and not r.tokens_estimated and r.finish_reason == "length"
    s = summarize(result.results, result.duration_s, result.time_scale)
    assert s["completed"] == 24 and s["failed"] == 0 and s["output_tokens"] == 24 * 48
    assert s["prompt_tokens"] == sum(r.target_prompt_tokens or 0 for r in result.results)
    # Engine-time figures: seconds of TTFT for 2-7k-token prompts at 8 at a time on 3090s, not ms.
    assert 0.2 < (s["ttft_p50_s"] or 0) < 30
    assert s["output_tokens_per_s"] > 0 and s["duration_s"] > result.duration_s * 50


async def test_chat_requests_are_calibrated_too(sim_server) -> None:
    server = sim_server.start(SEED)
    spec = long_prompts(8, api="chat")
    async with http_client() as http:
        built = await build_requests(spec, http, server.url, MODEL)
        result = await replay(spec, built.requests, StreamingClient(http, server.url, MODEL))
    assert all(r.ok for r in result.results), [r.error for r in result.results]
    assert all(r.request_id and r.request_id.startswith("chatcmpl-") for r in result.results)
    assert [r.prompt_tokens for r in result.results] == [r.target_prompt_tokens for r in result.results]
    assert all(r.ttft_s is not None and len(r.itl_s) >= 1 for r in result.results)


async def test_measured_ttft_matches_what_the_engine_scheduled(sim_server) -> None:
    speedup = 20.0
    server = sim_server.start([*SEED, "--sim-speedup", str(speedup)])
    syn = SyntheticRequests(6, LengthDist("fixed", value=4000), LengthDist("fixed", value=24))
    spec = WorkloadSpec(syn, Arrivals("concurrency", concurrency=1, time_scale=speedup))
    async with http_client() as http:
        built = await build_requests(spec, http, server.url, MODEL)
        result = await replay(spec, built.requests, StreamingClient(http, server.url, MODEL))
        engine = {r["id"]: r for r in (await http.get(server.url + "/sim/requests")).json()["requests"]}
    gaps = []
    for r in result.results:
        assert r.ok and r.request_id and r.ttft_s is not None
        scheduled = engine[r.request_id.removeprefix("cmpl-")]
        scheduled_ttft = scheduled["first_token_s"] - scheduled["arrival_s"]
        assert scheduled_ttft > 0.3  # a 4000-token prefill: long enough to compare
        # What the client sees also holds the HTTP round trip and the server's event loop: the
        # simulator stamps arrival before parsing, so only a few ms of wall time.
        gaps.append(r.ttft_s - scheduled_ttft / speedup)
        assert -0.002 < gaps[-1] < 0.25, (r.ttft_s * speedup, scheduled_ttft)
        scheduled_decode = scheduled["finished_s"] - scheduled["first_token_s"]
        assert abs(sum(r.itl_s) - scheduled_decode / speedup) < 0.3
    assert statistics.median(gaps) < 0.05  # ~2 ms seen on an idle 2-CPU box; loose for loaded CI


async def test_auth_and_model_errors_are_failed_results(sim_server) -> None:
    server = sim_server.start([*SEED, "--api-key", "sk-test"])
    req = RequestSpec("hello world", None, 4)
    async with httpx.AsyncClient() as http:
        no_key = await StreamingClient(http, server.url, MODEL).send(req)
        wrong_key = await StreamingClient(http, server.url, MODEL, api_key="nope").send(req)
        wrong_model = await StreamingClient(http, server.url, "llama-3-70b", api_key="sk-test").send(req)
        good = await StreamingClient(http, server.url, MODEL, api_key="sk-test").send(req)
    for res in (no_key, wrong_key):
        assert not res.ok and res.status == 401 and res.error == "HTTP 401: Unauthorized"
    assert not wrong_model.ok and wrong_model.status == 404
    assert wrong_model.error == f"HTTP 404: The model `llama-3-70b` does not exist. Valid aliases: {MODEL}."
    assert good.ok and good.output_tokens == 4 and good.prompt_tokens == 4  # ceil(5/4) + ceil(5/4)


async def test_a_prompt_over_the_context_is_a_failed_result(sim_server) -> None:
    server = sim_server.start(SEED)
    async with httpx.AsyncClient() as http:
        res = await StreamingClient(http, server.url, MODEL).send(RequestSpec("word " * 9000, None, 4))
    assert not res.ok and res.status == 400
    assert res.error is not None and "maximum context length is 8192 tokens" in res.error
