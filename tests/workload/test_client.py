"""StreamingClient against a fake server that streams with real gaps: timing, parsing, failures."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from autotuner.engine.ports import free_port
from autotuner.workload.client import StreamingClient
from autotuner.workload.request_spec import RequestSpec
from tests.support.fake_openai import (
    DONE,
    Recorder,
    Step,
    chat_chunk,
    completion_chunk,
    data,
    simple_stream,
    sse_response,
    usage_chunk,
)

PROMPT = RequestSpec(prompt="hello there", messages=None, max_tokens=5, target_prompt_tokens=3)
CHAT = RequestSpec(prompt=None, messages=[{"role": "user", "content": "hi"}], max_tokens=4)


async def send(steps: list[Step] | httpx.Response, req: RequestSpec = PROMPT, **kw: object):
    rec = Recorder(lambda _: steps if isinstance(steps, httpx.Response) else sse_response(steps))
    async with rec.client() as http:
        client = StreamingClient(http, "http://engine:8000/", "m", **kw)  # type: ignore[arg-type]
        return await client.send(req), rec


async def test_ttft_itl_and_usage_from_a_paced_stream() -> None:
    steps: list[Step] = [
        (0.15, completion_chunk(" a")),
        (0.05, completion_chunk(" b")),
        (0.05, completion_chunk(" c")),
        (0.10, completion_chunk(" d", "length")),
        (0.0, usage_chunk(11, 7)),
        (0.0, DONE),
    ]
    res, _ = await send(steps)
    assert res.ok and res.error is None and res.status == 200
    assert res.ttft_s is not None and 0.15 <= res.ttft_s < 0.4  # upper bounds loose: CI is shared
    assert len(res.itl_s) == 3
    for gap, want in zip(res.itl_s, (0.05, 0.05, 0.10), strict=True):
        assert want - 0.002 <= gap < want + 0.2
    assert res.prompt_tokens == 11 and res.output_tokens == 7 and not res.tokens_estimated
    assert res.request_id == "cmpl-abc" and res.finish_reason == "length"
    assert res.e2e_s is not None and 0.35 <= res.e2e_s < 0.8
    assert res.tpot_s == pytest.approx((res.finished_at - res.first_token_at) / 6)
    assert res.target_prompt_tokens == 3


async def test_request_body_and_auth_header() -> None:
    res, rec = await send(simple_stream(2), api_key="sk-1", ignore_eos=False)
    assert res.ok
    body = rec.bodies[0]
    assert body == {"model": "m", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
                    "ignore_eos": False, "prompt": "hello there"}
    assert rec.headers[0]["authorization"] == "Bearer sk-1"
    res, rec = await send(simple_stream(2), req=CHAT)
    assert rec.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]
    assert "prompt" not in rec.bodies[0] and rec.bodies[0]["ignore_eos"] is True
    assert "authorization" not in rec.headers[0]


async def test_chat_ttft_waits_for_content_not_the_role_chunk() -> None:
    steps: list[Step] = [
        (0.0, chat_chunk(None, role=True)),
        (0.12, chat_chunk("Hel")),
        (0.04, chat_chunk("lo", finish="stop")),
        (0.0, usage_chunk(9, 2)),
        (0.0, DONE),
    ]
    res, _ = await send(steps, req=CHAT)
    assert res.ok and res.output_tokens == 2 and res.finish_reason == "stop"
    # At the first content (not the role chunk, not the end); upper bounds loose: a loaded box is slow.
    assert res.ttft_s is not None and res.e2e_s is not None and 0.12 <= res.ttft_s < min(1.0, res.e2e_s)
    assert len(res.itl_s) == 1 and 0.038 <= res.itl_s[0] < 1.0


async def test_without_usage_tokens_are_counted_from_chunks_and_marked_estimated() -> None:
    steps: list[Step] = [(0.0, completion_chunk(" x")) for _ in range(4)]
    steps += [(0.0, completion_chunk("", "length")), (0.0, DONE)]  # an empty chunk carries no token
    res, _ = await send(steps)
    assert res.ok and res.output_tokens == 4 and res.tokens_estimated and res.prompt_tokens is None


async def test_queue_time_is_scheduled_to_sent() -> None:
    rec = Recorder(lambda _: sse_response(simple_stream(2)))
    async with rec.client() as http:
        client = StreamingClient(http, "http://e", "m")
        res = await client.send(PROMPT, scheduled_at=time.perf_counter() - 0.25)
    assert res.ok and res.queue_s is not None and 0.25 <= res.queue_s < 1.0


VLLM_404 = {"error": {"message": "The model `x` does not exist. Valid aliases: m.", "type": "NotFoundError",
                      "param": "model", "code": 404}}


@pytest.mark.parametrize(("response", "status", "message"), [
    (httpx.Response(401, json={"error": "Unauthorized"}), 401, "HTTP 401: Unauthorized"),
    (httpx.Response(404, json=VLLM_404), 404, "HTTP 404: The model `x` does not exist. Valid aliases: m."),
    (httpx.Response(400, json={"detail": "bad max_tokens"}), 400, "HTTP 400: bad max_tokens"),
    (httpx.Response(500, text="Internal Server Error"), 500, "HTTP 500: Internal Server Error"),
    (sse_response([(0.0, completion_chunk(" a")),
                   (0.0, data({"error": {"message": "EngineCore encountered an issue.", "code": 500}})),
                   (0.0, DONE)]), 200, "error in stream: EngineCore encountered an issue."),
    (sse_response([(0.0, data({"id": "x", "object": "weird"})), (0.0, DONE)]), 200,
     "stream chunk without `choices`"),
    (sse_response([(0.0, completion_chunk(" a")), (0.0, completion_chunk(" b"))]), 200,
     "stream ended before [DONE]"),
    (sse_response([(0.0, completion_chunk(" a")),
                   (0.01, httpx.RemoteProtocolError("peer closed connection without sending complete "
                                                    "message body"))]), 200,
     "stream cut before [DONE]: peer closed connection"),
    (sse_response([(0.0, "data: {not json\n\n"), (0.0, DONE)]), 200, "malformed stream chunk"),
    (sse_response([(0.0, usage_chunk(5, 0)), (0.0, DONE)]), 200, "response finished without any output"),
])  # fmt: skip
async def test_failures_are_results_with_status_and_a_short_message(
        response: httpx.Response, status: int, message: str) -> None:
    res, _ = await send(response)
    assert not res.ok
    assert res.status == status
    assert res.error is not None and res.error.startswith(message), res.error
    assert len(res.error) <= 300


async def test_connect_error_on_a_closed_port_is_a_result() -> None:
    async with httpx.AsyncClient() as http:
        client = StreamingClient(http, f"http://127.0.0.1:{free_port()}", "m")
        res = await client.send(PROMPT)
    assert not res.ok and res.status is None
    assert res.error is not None and res.error.startswith("connect error")


async def test_transport_exception_is_a_result() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        res = await StreamingClient(http, "http://e", "m").send(PROMPT)
    assert not res.ok and res.error == "connect error: connection refused"


async def test_timeout_covers_the_whole_stream() -> None:
    # Chunks keep coming, so no single read times out: only a whole-request deadline stops it.
    steps: list[Step] = [(0.05, completion_chunk(" a")) for _ in range(40)]
    t0 = time.perf_counter()
    res, _ = await send(steps, timeout_s=0.3)
    took = time.perf_counter() - t0
    assert not res.ok and res.error == "timed out after 0.3s"
    assert 0.3 <= took < 1.5  # the whole stream would take 2 s
    assert res.ttft_s is not None  # what was measured before the deadline is kept


async def test_cancellation_propagates() -> None:
    rec = Recorder(lambda _: sse_response([(5.0, completion_chunk(" a")), (0.0, DONE)]))
    async with rec.client() as http:
        task = asyncio.ensure_future(StreamingClient(http, "http://e", "m").send(PROMPT))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_requests_spread_round_robin_over_extra_clients() -> None:
    recorders = [Recorder(lambda _: sse_response(simple_stream(2))) for _ in range(3)]
    async with recorders[0].client() as a, recorders[1].client() as b, recorders[2].client() as c:
        client = StreamingClient(a, "http://engine:8000/", "m", extra=[b, c])
        results = await asyncio.gather(*(client.send(PROMPT) for _ in range(9)))
    assert all(r.ok for r in results)
    assert [len(r.bodies) for r in recorders] == [3, 3, 3]
