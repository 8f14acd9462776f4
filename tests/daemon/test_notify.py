"""Webhook notifications against a real HTTP receiver (Starlette on uvicorn, on a free port of 127.0.0.1)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from structlog.testing import capture_logs

from autotuner.daemon.http import DaemonServer
from autotuner.daemon.notify import EVENTS, Notifier, NotifySettings

HOOK_ENV = "AT_TEST_WEBHOOK_URL"
SECRET_PATH = "/services/T0AAAA/B0BBBB/xoxb-hook-s3cret"


class Receiver:
    """Records each POST's JSON; answers 503 to the first `fail_first` of them; takes `slow_first` seconds
    over the first one (a later post sent alongside it would be recorded before it)."""

    def __init__(self, fail_first: int = 0, slow_first: float = 0.0) -> None:
        self.fail_first = fail_first
        self.slow_first = slow_first
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        self.url = ""

    async def hook(self, request: Request) -> Response:
        self.attempts += 1
        if self.attempts <= self.fail_first:
            return Response(status_code=503)
        if self.attempts == 1:
            await asyncio.sleep(self.slow_first)
        self.bodies.append(await request.json())
        return JSONResponse({"ok": True})


@asynccontextmanager
async def receiving(fail_first: int = 0, slow_first: float = 0.0) -> AsyncIterator[Receiver]:
    receiver = Receiver(fail_first, slow_first)
    app = Starlette(routes=[Route(SECRET_PATH, receiver.hook, methods=["POST"])])
    server = DaemonServer(app, "127.0.0.1", 0)
    receiver.url = f"http://127.0.0.1:{await server.start()}{SECRET_PATH}"
    try:
        yield receiver
    finally:
        await server.stop()


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}{SECRET_PATH}"


def test_settings_validate_names_and_events() -> None:
    s = NotifySettings(webhook_env="SLACK_HOOK")
    assert s.events == list(EVENTS) and s.timeout_s == 5
    for bad in ({"webhook_env": "A;B"}, {"webhook_env": "1A"}, {"webhook_env": "A B\n"},
                {"webhook_env": "A", "events": ["cycle-end", "tea-time"]}, {"webhook_env": "A", "timeout_s": 0},
                {"webhook_env": "A", "timeout_s": float("inf")}, {"webhook_env": "A", "url": "http://x"}):
        with pytest.raises(ValidationError):
            NotifySettings(**bad)
    with pytest.raises(ValidationError, match=r"tea-time.*choose from"):
        NotifySettings(webhook_env="A", events=["tea-time"])


async def test_the_post_is_slack_shaped_in_order_and_filtered_by_events(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # httpx logs each request's URL at INFO
    # A proxy in the environment is for the outside world: a receiver on loopback is reached directly.
    monkeypatch.setenv("HTTP_PROXY", _dead_url())
    monkeypatch.setenv("ALL_PROXY", _dead_url())
    async with receiving(slow_first=0.3) as receiver:
        monkeypatch.setenv(HOOK_ENV, receiver.url)
        notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV, events=["production-down", "production-up"]),
                            "prod-a")
        notifier.notify("production-down", "production is down", {"since": 12.5, "gpus": [0, 1]})
        notifier.notify("cycle-end", "not wanted")
        notifier.notify("production-up", "production is back", {"after_s": 3})
        await notifier.aclose(5)
    assert "HTTP Request: POST" in caplog.text and SECRET_PATH not in caplog.text
    assert receiver.bodies == [
        {"text": "[prod-a] production is down", "event": "production-down", "deployment": "prod-a",
         "detail": {"since": 12.5, "gpus": [0, 1]}},
        {"text": "[prod-a] production is back", "event": "production-up", "deployment": "prod-a",
         "detail": {"after_s": 3}}]


async def test_a_503_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    async with receiving(fail_first=1) as receiver:
        monkeypatch.setenv(HOOK_ENV, receiver.url)
        notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV), "prod")
        notifier.notify("rollback", "rolled back", {"cycle": 7})
        await notifier.aclose(10)
    assert receiver.attempts == 2
    assert [b["detail"] for b in receiver.bodies] == [{"cycle": 7}]


async def test_a_dead_url_neither_raises_nor_blocks_and_the_url_is_never_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # httpx's own request lines included
    url = _dead_url()
    monkeypatch.setenv(HOOK_ENV, url)
    # A receiver that accepts and never answers: each attempt waits its whole timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}{SECRET_PATH}"
    try:
        with capture_logs() as logs:
            notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV, timeout_s=0.3), "prod")
            started = time.monotonic()
            notifier.notify("mitigation", "mitigated", {"url_seen": url})
            returned_in = time.monotonic() - started
            await notifier.aclose(10)  # refused at once, three times, 1.5 s of backoff
            monkeypatch.setenv(HOOK_ENV, silent_url)
            silent_notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV, timeout_s=5), "prod")
            silent_notifier.notify("mitigation", "mitigated")
            started = time.monotonic()
            await silent_notifier.aclose(0.5)
            closed_in = time.monotonic() - started
    finally:
        silent.close()
    assert returned_in < 0.05
    assert closed_in < 1.5
    failed = [e for e in logs if e["event"] == "daemon.notify_failed"]
    assert failed and failed[0]["error"] == "ConnectError"
    assert any(e["event"] == "daemon.notify_dropped" and e["reason"] == "shutdown" for e in logs)
    everything = repr(logs) + caplog.text
    for secret in (url, silent_url, SECRET_PATH, "xoxb-hook-s3cret"):
        assert secret not in everything


async def test_an_unset_variable_is_said_once_and_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOOK_ENV, raising=False)
    with capture_logs() as logs:
        notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV), "prod")
        for _ in range(3):
            notifier.notify("cycle-end", "done")
        Notifier(None, "prod").notify("cycle-end", "done")
        await notifier.aclose(1)
    unset = [e for e in logs if e["event"] == "daemon.notify_unset"]
    assert len(unset) == 1 and unset[0]["variable"] == HOOK_ENV
    assert not notifier._pending


async def test_a_notification_from_a_worker_thread_is_sent_from_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async with receiving() as receiver:
        monkeypatch.setenv(HOOK_ENV, receiver.url)
        notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV), "prod")
        await asyncio.to_thread(notifier.notify, "proposed", "a config awaits approval", {"cycle": 3})
        await asyncio.sleep(0)  # the loop runs the scheduling callback
        await notifier.aclose(5)
    assert [b["event"] for b in receiver.bodies] == ["proposed"]


async def test_the_text_carries_the_comparison_and_the_verify_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a chat channel shows is what the certificate and /status say, word for word."""
    comparison = "no significant difference from your current config (trial 1) — output: …"
    verified = "verified in production: output 265.9 tok/s (within the range one run of the certified config …)"
    async with receiving() as receiver:
        monkeypatch.setenv(HOOK_ENV, receiver.url)
        notifier = Notifier(NotifySettings(webhook_env=HOOK_ENV), "prod-a")
        notifier.notify("cycle-end", "cycle 3 deployed trial 7", {"comparison": comparison, "verify": verified})
        notifier.notify("proposed", "cycle 4 proposes trial 9", {"comparison": None, "flags": {}})
        await notifier.aclose(5)
    assert [b["text"] for b in receiver.bodies] == [
        f"[prod-a] cycle 3 deployed trial 7\n{comparison}\n{verified}", "[prod-a] cycle 4 proposes trial 9"]
