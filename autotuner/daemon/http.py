"""The daemon's endpoint (Starlette on uvicorn, in the daemon's own event loop, as the simulator serves):
`GET /healthz` open; `GET /status` and `GET /metrics` only with `Authorization: Bearer <token>`, the token
read from the variable named by `listen.token_env`. Binds 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from autotuner.daemon.state import DEPLOYED, FAILED, RESTORED, ROLLED_BACK, SKIPPED, STATES, CycleStore
from autotuner.daemon.triggers import CRASH, KV_PRESSURE, OOM
from autotuner.errors import UserInputError

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class DaemonCollector(Collector):
    """Read from the database at each scrape: counts survive restarts, one source of truth."""

    def __init__(self, states: CycleStore, state: Callable[[], str]) -> None:
        self.states = states
        self.state = state

    def collect(self) -> Iterator[Any]:
        current = self.state()
        g = GaugeMetricFamily("autotuner_daemon_state", "The daemon's cycle state (1 for the current one)",
                              labels=["state"])
        for name in ("idle", *STATES):
            g.add_metric([name], 1.0 if name == current else 0.0)
        yield g
        counts = self.states.counts()
        c = CounterMetricFamily("autotuner_daemon_cycles", "Cycles ended, by outcome", labels=["outcome"])
        for outcome in (DEPLOYED, ROLLED_BACK, RESTORED, SKIPPED, FAILED):
            c.add_metric([outcome], float(counts.get(outcome, 0)))
        yield c
        yield CounterMetricFamily("autotuner_daemon_trials", "Tuning trials run by the daemon's cycles",
                                  value=float(counts["trials"]))
        yield CounterMetricFamily("autotuner_daemon_rollbacks", "Deployed candidates rolled back",
                                  value=float(counts.get(ROLLED_BACK, 0)))
        ooms = sum(1 for e in self.states.events(kind="trigger", limit=10_000)
                   if e.detail.get("kind") in (OOM, CRASH, KV_PRESSURE))
        yield CounterMetricFamily("autotuner_daemon_production_oom_events",
                                  "Production OOM, crash or KV-pressure events seen", value=float(ooms))
        h = GaugeMetricFamily("autotuner_daemon_deployed_headroom_gib",
                              "GPU memory headroom of the deployed config, as certified", labels=["gpu"])
        deployed = self.states.last_deployed()
        for i, room in enumerate(((deployed.certificate or {}).get("headroom_gib") or []) if deployed else []):
            h.add_metric([str(i)], float(room))
        yield h


def _authorized(request: Request, token_env: str) -> bool:
    token = os.environ.get(token_env)
    if not token:
        return False  # no token configured: nothing but /healthz is served
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def build_app(status: Callable[[], dict[str, Any]], registry: CollectorRegistry, token_env: str) -> Starlette:
    def denied() -> Response:
        return JSONResponse({"error": f"send Authorization: Bearer <the token in ${token_env}>"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def status_route(request: Request) -> Response:
        if not _authorized(request, token_env):
            return denied()
        return JSONResponse(await asyncio.to_thread(status))

    async def metrics(request: Request) -> Response:
        if not _authorized(request, token_env):
            return denied()
        return Response(await asyncio.to_thread(generate_latest, registry), media_type=PROMETHEUS_TEXT)

    return Starlette(routes=[Route("/healthz", healthz), Route("/status", status_route), Route("/metrics", metrics)])


class DaemonServer:
    """uvicorn in the running loop; the daemon handles the signals, not uvicorn."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
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
