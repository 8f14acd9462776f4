"""The daemon's endpoint (Starlette on uvicorn, in the daemon's own event loop, as the simulator serves):
`GET /healthz` open; `GET /status` and `GET /metrics` only with `Authorization: Bearer <token>`, the token
read from the variable named by `listen.token_env`. Binds 127.0.0.1 unless told otherwise.

The endpoint shares the daemon's process, so it must never take from the daemon what the production poll
needs: file descriptors and worker threads. uvicorn bounds neither the sockets it accepts nor the time a
client may take to send its request (see `guarded_protocol`), so the protocol here does both."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from autotuner.daemon.state import OUTCOMES, ROLLED_BACK, STATES, CycleStore
from autotuner.daemon.triggers import CRASH, KV_PRESSURE, OOM
from autotuner.errors import UserInputError

log = structlog.get_logger("autotuner.daemon")

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

# The metric families the collector exports: the one place their names are written (the dashboard and
# the alert rules in docker/ are checked against a real scrape). Counters are exposed with `_total`.
STATE = "autotuner_daemon_state"
CYCLES = "autotuner_daemon_cycles"
TRIALS = "autotuner_daemon_trials"
ROLLBACKS = "autotuner_daemon_rollbacks"
PRODUCTION_OOM_EVENTS = "autotuner_daemon_production_oom_events"
DEPLOYED_HEADROOM = "autotuner_daemon_deployed_headroom_gib"
PRODUCTION_UP = "autotuner_daemon_production_up"
LAST_POLL_SUCCESS = "autotuner_daemon_last_poll_success_timestamp_seconds"
LAST_CYCLE_OUTCOME = "autotuner_daemon_last_cycle_outcome"
DOWNTIME = "autotuner_daemon_downtime_seconds"
MITIGATIONS = "autotuner_daemon_emergency_mitigations"
REFUSALS = "autotuner_daemon_refused_configs"

Health = Callable[[], Mapping[str, Any]]


class DaemonCollector(Collector):
    """Read at each scrape: counts from the database (they survive restarts, one source of truth), and
    production's health from `health` (the daemon's own view: `production_up` True/False/None for unknown,
    `last_poll_success_at` unix time or None, `downtime_seconds_total`, `last_cycle_outcome`,
    `mitigations_total`, `refusals_total`)."""

    def __init__(self, states: CycleStore, state: Callable[[], str], health: Health | None = None) -> None:
        self.states = states
        self.state = state
        self.health = health

    def collect(self) -> Iterator[Any]:
        current = self.state()
        g = GaugeMetricFamily(STATE, "The daemon's cycle state (1 for the current one)", labels=["state"])
        for name in ("idle", *STATES):
            g.add_metric([name], 1.0 if name == current else 0.0)
        yield g
        counts = self.states.counts()
        c = CounterMetricFamily(CYCLES, "Cycles ended, by outcome", labels=["outcome"])
        for outcome in OUTCOMES:
            c.add_metric([outcome], float(counts.get(outcome, 0)))
        yield c
        yield CounterMetricFamily(TRIALS, "Tuning trials run by the daemon's cycles", value=float(counts["trials"]))
        yield CounterMetricFamily(ROLLBACKS, "Deployed candidates rolled back", value=float(counts.get(ROLLED_BACK, 0)))
        ooms = sum(1 for e in self.states.events(kind="trigger", limit=10_000)
                   if e.detail.get("kind") in (OOM, CRASH, KV_PRESSURE))
        yield CounterMetricFamily(PRODUCTION_OOM_EVENTS, "Production OOM, crash or KV-pressure events seen",
                                  value=float(ooms))
        h = GaugeMetricFamily(DEPLOYED_HEADROOM, "GPU memory headroom of the deployed config, as certified",
                              labels=["gpu"])
        deployed = self.states.last_deployed()
        for i, room in enumerate(((deployed.certificate or {}).get("headroom_gib") or []) if deployed else []):
            h.add_metric([str(i)], float(room))
        yield h
        if self.health is not None:
            yield from health_metrics(self.health())


def health_metrics(health: Mapping[str, Any]) -> Iterator[Any]:
    """The gauges to alert on. An unknown value is an absent sample, never a 0 that would page someone."""
    up = GaugeMetricFamily(PRODUCTION_UP, "Production answers its health check (1) or not (0); absent when unknown")
    if health.get("production_up") is not None:
        up.add_metric([], 1.0 if health["production_up"] else 0.0)
    yield up
    polled = GaugeMetricFamily(LAST_POLL_SUCCESS, "Unix time of the daemon's last successful production poll")
    if health.get("last_poll_success_at") is not None:
        polled.add_metric([], float(health["last_poll_success_at"]))
    yield polled
    last = health.get("last_cycle_outcome")
    outcome = GaugeMetricFamily(LAST_CYCLE_OUTCOME, "How the last cycle ended (1 for that outcome)",
                                labels=["outcome"])
    for name in (*OUTCOMES, *([str(last)] if last is not None and last not in OUTCOMES else [])):
        outcome.add_metric([name], 1.0 if name == last else 0.0)
    yield outcome
    yield CounterMetricFamily(DOWNTIME, "Seconds production was down, measured from its own health",
                              value=float(health.get("downtime_seconds_total") or 0.0))
    yield CounterMetricFamily(MITIGATIONS, "Emergency mitigations: production restored at once after a crash",
                              value=float(health.get("mitigations_total") or 0))
    yield CounterMetricFamily(REFUSALS, "Configs refused by production (failed start, failed verify, OOM)",
                              value=float(health.get("refusals_total") or 0))


def _authorized(request: Request, token_env: str) -> bool:
    token = os.environ.get(token_env)
    if not token:
        return False  # no token configured: nothing but /healthz is served
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def build_app(status: Callable[[], dict[str, Any]], registry: CollectorRegistry, token_env: str) -> Starlette:
    # Its own two threads: a burst of scrapes queues here instead of taking the default executor's
    # threads, which the daemon's own `to_thread` work (the poll, the database) needs.
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="daemon-http")

    async def in_pool(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def denied() -> Response:
        return JSONResponse({"error": f"send Authorization: Bearer <the token in ${token_env}>"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def status_route(request: Request) -> Response:
        if not _authorized(request, token_env):
            return denied()
        return JSONResponse(await in_pool(status))

    async def metrics(request: Request) -> Response:
        if not _authorized(request, token_env):
            return denied()
        return Response(await in_pool(generate_latest, registry), media_type=PROMETHEUS_TEXT)

    app = Starlette(routes=[Route("/healthz", healthz), Route("/status", status_route), Route("/metrics", metrics)])
    # No redirects at all: Starlette answers `/status/` with a 307 whose Location it builds from the
    # client's Host header. An unknown path, with or without its slash, is a 404.
    app.router.redirect_slashes = False
    return app


def guarded_protocol(max_connections: int, header_timeout_s: float,
                     base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) with the two bounds uvicorn lacks (uvicorn 0.54):

    - Accepted sockets. `backlog` bounds only the kernel's queue of connections not yet accepted, which
      hold no descriptor of ours; asyncio then accepts up to `backlog` sockets per wake-up for as long as
      they come (asyncio/selector_events.py `_accept_connection`), and `limit_concurrency` answers 503 only
      once a request has arrived on an already accepted socket (httptools_impl.py `on_headers_complete`).
      Here, past `max_connections` open sockets the one that has waited longest without a request in
      flight is closed at once, so a flood of idle sockets cannot lock out a new /healthz probe.
    - The time to send a request. uvicorn arms its keep-alive timer only after a response
      (`on_response_complete`) and cancels it at the first byte received (`data_received` →
      `_unset_keepalive_if_required`), so a socket that sends nothing, or half a request line, or one byte
      at a time, is never closed (uvicorn issue #157 lists `--timeout-request-start` as still open; PR #1192
      for a silent socket was closed unmerged). Here a connection gets `header_timeout_s` from the moment
      it waits for a request (connected, or its last response sent) to the end of that request's headers.
    """
    dropped = {"count": 0, "logged_at": 0.0}

    class Guarded(base):  # type: ignore[misc, valid-type]
        _waiting_since: float | None = None
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._wait()
            if len(self.connections) > max_connections:
                waiting = [c for c in self.connections if getattr(c, "_waiting_since", None) is not None]
                oldest = min(waiting, key=lambda c: c._waiting_since)  # self waits too: never empty
                oldest._drop()
                dropped["count"] += 1
                if time.monotonic() - dropped["logged_at"] > 60:  # a flood says so once a minute
                    dropped["logged_at"] = time.monotonic()
                    log.warning("daemon.http_connections_dropped", dropped=dropped["count"],
                                max_connections=max_connections)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a request's headers are complete: its answer is on the way
                self._stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._wait()

        def _wait(self) -> None:
            self._stop_waiting()
            self._waiting_since = self.loop.time()
            self._deadline = self.loop.call_later(header_timeout_s, self._expired)

        def _stop_waiting(self) -> None:
            self._waiting_since = None
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            if self._waiting_since is not None:
                self._drop()

        def _drop(self) -> None:
            self._stop_waiting()
            # abort, not close: close waits to flush what the client may never read, keeping the socket
            self.transport.abort()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


class DaemonServer:
    """uvicorn in the running loop; the daemon handles the signals, not uvicorn.

    At most `max_connections` sockets open at once (the daemon's unit sets LimitNOFILE well above it), each
    given `header_timeout_s` to send a request; websockets and lifespan off."""

    def __init__(self, app: Starlette, host: str, port: int, *, max_connections: int = 64,
                 header_timeout_s: float = 10.0, backlog: int = 64) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                                ws="none", backlog=backlog, timeout_keep_alive=5,
                                http=guarded_protocol(max_connections, header_timeout_s))
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind first (a port in use is bad input, said once), then serve on that socket; the bound port."""
        config = self.server.config
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.host, config.port))
        except OSError as exc:
            sock.close()
            raise UserInputError(f"listen {config.host}:{config.port}: cannot bind ({exc.strerror}); choose a free "
                                 "listen.port or another listen.host") from None
        self.task = asyncio.ensure_future(self.server.serve(sockets=[sock]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise UserInputError(f"listen {config.host}:{config.port}: the endpoint did not start")
            await asyncio.sleep(0.02)
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.task, timeout=5)
