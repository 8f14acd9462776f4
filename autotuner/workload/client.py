"""A streaming OpenAI-API client for measurement: every outcome, failures included, is a result.

Times are `time.perf_counter()` seconds. `sent_at` is when the request headers started going out
(httpx's trace hook), so time spent waiting for a pooled connection counts as client-side queueing,
not as the server's TTFT; transports without the hook (MockTransport) fall back to the call time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotuner.workload.request_spec import RequestSpec

ERROR_CHARS = 300  # errors are for people and logs: the gist, not the whole body
CONNECT_TIMEOUT_S = 10.0


@dataclass(slots=True)
class RequestResult:
    ok: bool = False
    status: int | None = None  # HTTP status, None when no response came
    error: str | None = None
    request_id: str | None = None  # the response's `id` (e.g. `cmpl-…`)
    scheduled_at: float = 0.0  # when the schedule wanted it sent
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None
    output_tokens: int = 0
    tokens_estimated: bool = False  # no usage chunk: output_tokens counts content chunks
    finish_reason: str | None = None
    target_prompt_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_at is None or self.sent_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e_s(self) -> float | None:
        return None if self.sent_at is None else self.finished_at - self.sent_at

    @property
    def queue_s(self) -> float | None:
        return None if self.sent_at is None else max(0.0, self.sent_at - self.scheduled_at)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM bench's TPOT)."""
        if self.first_token_at is None or self.output_tokens < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.output_tokens - 1)


def shard_count(concurrency: int) -> int:
    """How many AsyncClients a replay at this concurrency needs (see STREAMS_PER_CLIENT)."""
    return max(1, -(-concurrency // STREAMS_PER_CLIENT))


def http_client(max_connections: int = 1024, *, trust_env: bool = False) -> httpx.AsyncClient:
    """An AsyncClient sized for a replay: a pool smaller than the concurrency would queue requests
    inside httpx (it shows up as queue time, but it is not the load that was asked for).

    `trust_env=False` (the default): the engines we start listen on 127.0.0.1, and a proxy from
    HTTP_PROXY/ALL_PROXY must never sit between them and the measurement. Only `verify`, which talks
    to the user's endpoint, passes True and so honours the user's proxy settings."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                             trust_env=trust_env)


# Streams per AsyncClient. httpcore's pool rescans every connection on every event, so one client
# with 64 streams lags ~0.25 s per request on 2 cores (benchmarks/sim_timing_fidelity.py); shards of
# this size keep the client from being the bottleneck.
STREAMS_PER_CLIENT = 8


class StreamingClient:
    """Sends requests over one shared AsyncClient, or round-robin over several (`extra` clients),
    which is how a high-concurrency replay keeps client-side lag out of TTFT."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, model: str, api_key: str | None = None, *,
                 ignore_eos: bool = True, timeout_s: float = 600.0,
                 extra: Sequence[httpx.AsyncClient] = ()) -> None:
        self._pool = [http, *extra]
        self._next = 0
        base = base_url.rstrip("/")
        self._urls = (base + "/v1/completions", base + "/v1/chat/completions")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.ignore_eos = ignore_eos
        self.timeout_s = timeout_s
        # Per request, so a shared client's defaults (httpx: 5 s read) cannot cut a long prefill.
        self._timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))

    async def send(self, req: RequestSpec, scheduled_at: float | None = None) -> RequestResult:
        """Never raises (cancellation aside, which propagates so a replay can be stopped)."""
        now = time.perf_counter()
        res = RequestResult(scheduled_at=now if scheduled_at is None else scheduled_at,
                            target_prompt_tokens=req.target_prompt_tokens)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._stream(req, res)
        except TimeoutError:
            res.error = f"timed out after {self.timeout_s:g}s"
        except httpx.ConnectError as exc:
            res.error = _short(f"connect error: {exc}")
        except httpx.TimeoutException as exc:
            res.error = _short(f"timed out ({type(exc).__name__})")
        except httpx.RemoteProtocolError as exc:
            res.error = _short(f"stream cut before [DONE]: {exc}")
        except (httpx.ReadError, httpx.WriteError) as exc:
            # A reset connection: httpx's error often has no text of its own, so say what happened.
            detail = f": {exc}" if str(exc) else ""
            res.error = _short(f"connection reset by the server ({type(exc).__name__}{detail})")
        except httpx.HTTPError as exc:
            res.error = _short(f"{type(exc).__name__}: {exc}")
        except json.JSONDecodeError as exc:
            res.error = _short(f"malformed stream chunk: {exc.msg}")
        except Exception as exc:  # a result, never a crash of the replay
            res.error = _short(f"{type(exc).__name__}: {exc}")
        if res.error is not None:
            res.ok = False
        res.finished_at = time.perf_counter()
        return res

    def _body(self, req: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": req.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}, "ignore_eos": self.ignore_eos}
        if req.messages is not None:
            body["messages"] = req.messages
        else:
            body["prompt"] = req.prompt
        return body

    async def _stream(self, req: RequestSpec, res: RequestResult) -> None:
        chat = req.messages is not None

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith("send_request_headers.started"):
                res.sent_at = time.perf_counter()

        res.sent_at = time.perf_counter()
        http = self._pool[self._next % len(self._pool)]
        self._next += 1
        async with http.stream("POST", self._urls[chat], json=self._body(req), headers=self._headers,
                                     timeout=self._timeout, extensions={"trace": trace}) as resp:
            res.status = resp.status_code
            if resp.status_code >= 400:
                await resp.aread()
                res.error = _short(f"HTTP {resp.status_code}: {_error_message(resp)}")
                return
            await self._read_events(resp, res, chat)

    @staticmethod
    async def _read_events(resp: httpx.Response, res: RequestResult, chat: bool) -> None:
        done = False
        chunks = 0
        last = 0.0
        usage: dict[str, Any] | None = None
        perf = time.perf_counter
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                res.error = _short(f"error in stream: {_message_of(obj['error'])}")
                return
            choices = obj.get("choices")
            if choices is None:
                res.error = _short(f"stream chunk without `choices`: {data[:120]}")
                return
            if res.request_id is None:
                res.request_id = obj.get("id")
            if obj.get("usage"):
                usage = obj["usage"]
            if not choices:
                continue
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if text:
                t = perf()
                if chunks:
                    res.itl_s.append(t - last)
                else:
                    res.first_token_at = t
                last = t
                chunks += 1
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]
        if not done:
            res.error = "stream ended before [DONE]"
            return
        if usage is not None:
            res.prompt_tokens = usage.get("prompt_tokens")
            res.output_tokens = int(usage.get("completion_tokens") or 0)
        else:
            res.output_tokens, res.tokens_estimated = chunks, True
        if res.output_tokens == 0 and chunks == 0:
            res.error = "response finished without any output"
            return
        res.ok = True


def _message_of(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)
    return str(err)


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return resp.text.strip() or resp.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            if key in body:
                return _message_of(body[key])
    return str(body)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
