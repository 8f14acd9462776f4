"""A fake OpenAI-compatible server on httpx.MockTransport whose SSE bodies stream chunk by chunk
with real sleeps between them, so that TTFT and ITL are measurable (the ASGI transport would
buffer the whole body): the chunk builders, `sse_response`, `simple_stream` and the `Recorder` that
counts requests in flight. The client, replay and view tests all stream from it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Step = tuple[float, str | Exception]  # sleep this long, then send the text (or raise the error)


def data(obj: object) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def completion_chunk(text: str, finish: str | None = None, rid: str = "cmpl-abc") -> str:
    return data({"id": rid, "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def chat_chunk(content: str | None, role: bool = False, finish: str | None = None) -> str:
    delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
    if content is not None:
        delta["content"] = content
    return data({"id": "chatcmpl-xyz", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def usage_chunk(prompt: int, completion: int) -> str:
    return data({"id": "cmpl-abc", "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})


DONE = "data: [DONE]\n\n"


async def _body(steps: list[Step]) -> AsyncIterator[bytes]:
    for delay, item in steps:
        if delay:
            await asyncio.sleep(delay)
        if isinstance(item, Exception):
            raise item
        yield item.encode()


def sse_response(steps: list[Step], status: int = 200) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=_body(steps))


def simple_stream(tokens: int, gap_s: float = 0.0, first_s: float = 0.0, prompt_tokens: int = 10) -> list[Step]:
    steps: list[Step] = [(first_s, completion_chunk(" tok"))]
    steps += [(gap_s, completion_chunk(" tok", "length" if i == tokens - 2 else None)) for i in range(tokens - 1)]
    return [*steps, (0.0, usage_chunk(prompt_tokens, tokens)), (0.0, DONE)]


class _Tracked(httpx.AsyncByteStream):
    """A response body that counts its request as open until the client closes it (httpx closes
    the stream when the response is closed, whether or not it was read to the end)."""

    def __init__(self, owner: Recorder, inner: Any) -> None:
        self._owner, self._inner, self._open = owner, inner, True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._owner.in_flight -= 1
            if hasattr(self._inner, "aclose"):
                await self._inner.aclose()


@dataclass
class Recorder:
    """Serves every request with `respond` and records when each arrived and how many were open."""

    respond: Callable[[httpx.Request], Awaitable[httpx.Response] | httpx.Response]
    arrivals: list[float] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.arrivals.append(time.perf_counter())
        self.bodies.append(json.loads(request.content) if request.content else {})
        self.headers.append(request.headers)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = self.respond(request)
            if not isinstance(resp, httpx.Response):
                resp = await resp
        except BaseException:
            self.in_flight -= 1
            raise
        return httpx.Response(resp.status_code, headers=resp.headers, stream=_Tracked(self, resp.stream))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
