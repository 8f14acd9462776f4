"""`measure` and `verify` progress: the replayer tells a listener set in the context about each finished
request, and the bar shows completed / total and output tokens/s so far."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from autotuner.view.request_bar import RequestBar
from autotuner.workload.client import StreamingClient
from autotuner.workload.replay import replay, request_listener
from autotuner.workload.spec import Arrivals
from tests.support.replay import paced, reqs, spec


async def test_the_replayer_tells_a_listener_each_finished_request() -> None:
    heard: list[dict[str, Any]] = []
    token = request_listener.set(lambda kind, data: heard.append({"kind": kind, **data}))
    try:
        rec = paced(tokens=4)
        async with rec.client() as http:
            await replay(spec(Arrivals("concurrency", concurrency=3), warmup_requests=2), reqs(10),
                         StreamingClient(http, "http://e", "m"))
    finally:
        request_listener.reset(token)
    warm = [h for h in heard if h["phase"] == "warm-up"]
    measured = [h for h in heard if h["phase"] == "workload"]
    assert [h["done"] for h in warm] == [1, 2] and all(h["total"] == 2 for h in warm)
    assert [h["done"] for h in measured] == list(range(1, 9)) and all(h["total"] == 8 for h in measured)
    assert all(h["failed"] == 0 and h["kind"] == "request" for h in heard)
    assert all(h["output_tokens_per_s"] is None for h in warm)
    assert all(h["output_tokens_per_s"] > 0 for h in measured)


async def test_the_bar_shows_completed_of_total_and_tokens_per_second() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    rec = paced(tokens=4)
    with RequestBar(console):
        async with rec.client() as http:
            await replay(spec(Arrivals("concurrency", concurrency=3), warmup_requests=2), reqs(10),
                         StreamingClient(http, "http://e", "m"))
    final = out.getvalue().replace("\r", "\n").splitlines()[-3:]
    text = "\n".join(final)
    assert "warm-up" in text and "2/2" in text
    assert "workload" in text and "8/8" in text and "tok/s" in text
