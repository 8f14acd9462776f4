"""The daemon's endpoint against a real uvicorn: auth, no redirects, the gauges to alert on, and abuse
(hundreds of half-open sockets, requests sent a byte at a time) that must not take the daemon's file
descriptors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from autotuner.daemon import http
from autotuner.daemon.http import DaemonCollector, DaemonServer, build_app
from autotuner.daemon.state import CONFIRM, DEPLOY, DEPLOYED, DONE, DRAIN, TUNE, VERIFY, WINDOW, CycleStore
from autotuner.store.db import Store
from tests.support.waiting import wait_for

TOKEN_ENV = "AT_TEST_DAEMON_TOKEN"
TOKEN = "s3cret-daemon-token"
REPO = Path(__file__).resolve().parents[2]

FULL_HEALTH: dict[str, Any] = {"production_up": False, "last_poll_success_at": 1_700_000_000.5,
                               "downtime_seconds_total": 42.5, "last_cycle_outcome": "failed",
                               "mitigations_total": 2, "refusals_total": 3}


def deployed_store(tmp_path: Path) -> CycleStore:
    """A database with one deployed cycle whose certificate gives two GPUs' headroom."""
    states = CycleStore(Store(str(tmp_path / "d.db")), "prod")
    cycle = states.begin("model-swap", {}, {})
    for step in (WINDOW, DRAIN, TUNE, CONFIRM, DEPLOY, VERIFY):
        states.transition(cycle, step)
    states.transition(cycle, DONE, outcome=DEPLOYED, trials=4, certificate={"headroom_gib": [1.5, 2.25]})
    return states


async def _served(app: Any, **server_kwargs: Any) -> tuple[DaemonServer, str]:
    server = DaemonServer(app, "127.0.0.1", 0, **server_kwargs)
    port = await server.start()
    return server, f"http://127.0.0.1:{port}"


def scrape(tmp_path: Path, health: Mapping[str, Any] | None) -> str:
    """GET /metrics of a real endpoint whose collector reads a real database and `health`."""
    states = deployed_store(tmp_path)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DaemonCollector(states, lambda: "idle", health=None if health is None else lambda: health))

    async def run() -> str:
        server, base = await _served(build_app(dict, registry, TOKEN_ENV))
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                r = await client.get(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
                assert r.status_code == 200, r.text
                return r.text
        finally:
            await server.stop()

    old = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = TOKEN
    try:
        return asyncio.run(run())
    finally:
        if old is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = old


def exported_samples(tmp_path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample name a fully populated collector exports, with its labels and values."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(scrape(tmp_path, FULL_HEALTH)):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_the_gauges_to_alert_on_come_from_the_health_provider(tmp_path: Path) -> None:
    samples = exported_samples(tmp_path)
    one = {name: values[0][1] for name, values in samples.items() if len(values) == 1}
    assert one["autotuner_daemon_production_up"] == 0.0
    assert one["autotuner_daemon_last_poll_success_timestamp_seconds"] == 1_700_000_000.5
    assert one["autotuner_daemon_downtime_seconds_total"] == 42.5
    assert one["autotuner_daemon_emergency_mitigations_total"] == 2.0
    assert one["autotuner_daemon_refused_configs_total"] == 3.0
    outcomes = {labels["outcome"]: v for labels, v in samples["autotuner_daemon_last_cycle_outcome"]}
    assert outcomes["failed"] == 1.0 and sum(outcomes.values()) == 1.0
    assert set(outcomes) >= {"deployed", "rolled-back", "restored", "skipped", "failed", "rejected", "written"}
    # The metrics that were there before are still there, from the database.
    assert one["autotuner_daemon_trials_total"] == 4.0
    cycles = {labels["outcome"]: v for labels, v in samples["autotuner_daemon_cycles_total"]}
    assert cycles["deployed"] == 1.0
    headroom = {labels["gpu"]: v for labels, v in samples["autotuner_daemon_deployed_headroom_gib"]}
    assert headroom == {"0": 1.5, "1": 2.25}
    # Names are written once, in http.py.
    assert http.PRODUCTION_UP in samples and http.LAST_POLL_SUCCESS in samples
    assert http.DOWNTIME + "_total" in samples and http.REFUSALS + "_total" in samples


def test_an_unknown_health_is_an_absent_sample_not_a_zero(tmp_path: Path) -> None:
    text = scrape(tmp_path, {"production_up": None, "last_poll_success_at": None, "last_cycle_outcome": None,
                             "downtime_seconds_total": 0.0, "mitigations_total": 0, "refusals_total": 0})
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "autotuner_daemon_production_up" not in names
    assert "autotuner_daemon_last_poll_success_timestamp_seconds" not in names
    assert "autotuner_daemon_downtime_seconds_total" in names
    (tmp_path / "up").mkdir()
    up = scrape(tmp_path / "up", {**FULL_HEALTH, "production_up": True})
    assert "autotuner_daemon_production_up 1.0" in up


def test_auth_and_no_redirects(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DaemonCollector(deployed_store(tmp_path), lambda: "idle", health=lambda: FULL_HEALTH))

    async def run() -> None:
        server, base = await _served(build_app(lambda: {"state": "idle"}, registry, TOKEN_ENV))
        try:
            async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
                good = {"Authorization": f"Bearer {TOKEN}"}
                assert (await client.get(base + "/healthz")).status_code == 200
                for path in ("/status", "/metrics"):
                    assert (await client.get(base + path)).status_code == 401
                    assert (await client.get(base + path, headers={"Authorization": "Bearer wrong"})).status_code == 401
                    assert (await client.get(base + path, headers={"Authorization": TOKEN})).status_code == 401
                    assert (await client.get(base + path, headers=good)).status_code == 200
                assert (await client.get(base + "/status", headers=good)).json() == {"state": "idle"}
                # A trailing slash, with any Host, is not a redirect to somewhere the client named.
                for path in ("/status/", "/metrics/", "/healthz/", "/nowhere", "/"):
                    r = await client.get(base + path, headers={**good, "Host": "evil.example"})
                    assert r.status_code == 404, (path, r.status_code)
                    assert "location" not in r.headers
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_request_sent_a_byte_at_a_time_is_cut_at_the_header_timeout() -> None:
    async def run() -> None:
        server, base = await _served(build_app(dict, CollectorRegistry(), TOKEN_ENV), header_timeout_s=0.5)
        port = int(base.rsplit(":", 1)[1])
        try:
            # A keep-alive client that got one answer, then trickles its next request.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in await asyncio.wait_for(reader.readuntil(b"{\"ok\":true}"), 5)
            started = time.monotonic()
            closed_after = None
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                        closed_after = time.monotonic() - started
                        break
                except TimeoutError:
                    continue
                except ConnectionError:
                    closed_after = time.monotonic() - started
                    break
            writer.close()
            assert closed_after is not None, "a trickled request held its connection open"
            assert 0.4 <= closed_after < 2.0, closed_after
            # A request that arrives whole is still answered.
            async with httpx.AsyncClient(trust_env=False) as client:
                assert (await client.get(base + "/healthz")).status_code == 200
        finally:
            await server.stop()

    asyncio.run(run())


# --- 800 half-open sockets against a daemon limited to 256 descriptors -------------------------------
FD_LIMIT = 256
HEADER_TIMEOUT_S = 1.5


def serve_under_a_low_fd_limit(progress: str) -> None:
    """The child: the endpoint, and a stand-in for the production poll that needs a descriptor every 20 ms,
    as the daemon's httpx poll does, and writes how many polls it made to `progress`. An EMFILE there is
    uncaught, as it was in the daemon: the poll stops."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, hard))
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o600)  # held open: writing it needs no new descriptor

    async def main() -> None:
        server = DaemonServer(build_app(dict, CollectorRegistry(), TOKEN_ENV), "127.0.0.1", 0,
                              header_timeout_s=HEADER_TIMEOUT_S)
        print(await server.start(), flush=True)
        polls = 0
        while True:
            os.close(os.open(os.devnull, os.O_RDONLY))
            polls += 1
            os.pwrite(fd, f"{polls:12d}".encode(), 0)
            await asyncio.sleep(0.02)

    asyncio.run(main())


def _open_sockets(pid: int) -> int:
    """The child's sockets now; a descriptor closed between the listing and its readlink is not one."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="inet"))


def _healthz(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_800_half_open_sockets_neither_exhaust_descriptors_nor_lock_out_healthz(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:  # the attacker's own 800 sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    progress = tmp_path / "polls"
    child = subprocess.Popen([sys.executable, "-c", "from tests.daemon.test_http import serve_under_a_low_fd_limit;"
                              f"serve_under_a_low_fd_limit({str(progress)!r})"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    attackers: list[socket.socket] = []

    def polls() -> int:
        text = progress.read_text().strip() if progress.exists() else ""
        return int(text) if text else 0

    try:
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "the endpoint did not start"
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        baseline = _open_sockets(child.pid)
        for i in range(800):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))  # non-blocking: a full accept queue must not stall the attacker
            attackers.append(s)
            if i % 2:
                with contextlib.suppress(OSError):
                    s.send(b"GET /heal")  # half a request line, never finished
        # While all 800 are held open: the daemon holds at most its bound, its poll goes on, /healthz answers.
        time.sleep(0.5)
        before = polls()
        wait_for(lambda: polls() >= before + 10, 5, "the poll going on during the flood")
        assert _open_sockets(child.pid) <= baseline + 64 + 8
        wait_for(lambda: _healthz(port), 5, "/healthz during the flood")
        # Once the idle ones time out, they are gone.
        wait_for(lambda: _open_sockets(child.pid) <= baseline + 2, HEADER_TIMEOUT_S + 3,
                 "the idle sockets closed at the header timeout")
        assert _healthz(port)
        before = polls()
        wait_for(lambda: polls() >= before + 10, 5, "the poll going on after the flood")
        assert child.poll() is None
    finally:
        for s in attackers:
            s.close()
        child.kill()
        child.wait(10)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
