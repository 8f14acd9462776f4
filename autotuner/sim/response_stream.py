"""One request's answer in OpenAI's wire format, from the tokens its engine `Stream` delivers.

Either server-sent events (`sse`, a chunk per engine step, as vLLM's output processor sends them) or
one whole JSON body (`whole`), for completions and chat alike (`ResponseShape`). A client that goes
away aborts its request in the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.responses import JSONResponse, Response

from autotuner.sim import tokens
from autotuner.sim.engine_loop import SimEngine, Stream


@dataclass(frozen=True)
class ResponseShape:
    """How one response's chunks look (completion or chat)."""

    chat: bool
    model: str
    prompt_tokens: int
    key: int
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, object]:
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish, "stop_reason": None}
            kind = "chat.completion.chunk"
            prefix = "chatcmpl-"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
            kind = "text_completion"
            prefix = "cmpl-"
        return {"id": prefix + self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object, as vLLM answers a failed request (and streams a failure mid-response)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _event(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def sse(engine: SimEngine, stream: Stream, shape: ResponseShape, include_usage: bool) -> AsyncIterator[str]:
    produced = 0
    finished = False
    try:
        if shape.chat:
            yield _event(shape.chunk(None, None, first=True))
        while not finished:
            item = await stream.queue.get()
            # Tokens that piled up while this response was not scheduled go out in one chunk, as
            # vLLM's output processor does when the client is slower than the engine.
            items = [item]
            while not stream.queue.empty():
                items.append(stream.queue.get_nowait())
            text = []
            for it in items:
                if isinstance(it, str):
                    yield _event(error_body(it, "InternalServerError", 500))
                    yield "data: [DONE]\n\n"
                    return
                if it is None:
                    finished = True
                else:
                    text.append(tokens.output_word(shape.key, it))
                    produced += 1
            finish = (stream.sim.finish_reason or "length") if finished else None
            if text or finish:
                yield _event(shape.chunk("".join(text), finish))
        if include_usage:
            last = shape.chunk(None, None)
            last["choices"] = []
            last["usage"] = shape.usage(produced)
            yield _event(last)
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            engine.abort(stream)


async def whole(engine: SimEngine, stream: Stream, shape: ResponseShape) -> Response:
    words: list[str] = []
    try:
        while True:
            item = await stream.queue.get()
            if isinstance(item, str):
                return JSONResponse(error_body(item, "InternalServerError", 500), status_code=500)
            if item is None:
                break
            words.append(tokens.output_word(shape.key, item))
    except asyncio.CancelledError:
        engine.abort(stream)
        raise
    text = "".join(words)
    finish = stream.sim.finish_reason or "length"
    if shape.chat:
        choice: dict[str, object] = {"index": 0, "message": {"role": "assistant", "content": text},
                                     "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind, prefix = "text_completion", "cmpl-"
    return JSONResponse({"id": prefix + shape.id, "object": kind, "created": shape.created,
                         "model": shape.model, "choices": [choice], "usage": shape.usage(len(words))})
