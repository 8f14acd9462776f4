"""Does a client of `autotuner sim serve` see the timings the simulated engine scheduled?

Starts the simulator as a real process (own session, private AUTOTUNER_SIM_STATE_DIR, free port),
waits for /health, then streams completions from one httpx.AsyncClient: closed loops of 8 and 64
concurrent streams, prompts of 1000-3000 tokens (unique 4-character words, one token each), 64 output
tokens, ignore_eos, include_usage; at --sim-speedup 1 and 20. Model/box: llama-2-7b on one simulated
H100-80GB, --gpu-memory-utilization 0.85: a 64-stream burst of such prompts takes ~6 simulated
seconds, so speed-up 1 stays short and the memory peak stays well under the card whatever the
arrival timing.

For every request: client TTFT (wall time from sending to the first content chunk) × speed-up, and
client end-to-end (to the chunk carrying finish_reason) × speed-up, against what the engine core
scheduled (`GET /sim/requests`, simulated seconds). Reported per (concurrency, speed-up) cell: median
and p95 of |client - scheduled| / scheduled, and, to explain the error, the wall-clock lags on each side
of the engine (ms): submit lag (engine arrival - client send) and delivery lag (client receipt - the
scheduled token time); both are measured against the process-shared monotonic clock, relative to
the least-lagged request of the run (submit lags are lower bounds, delivery lags upper bounds, their
sum exact; when every request of a burst waits in the client before its bytes leave, as with one
shared httpx pool, the split is biased towards delivery). Diagnostics: the same cells with one
AsyncClient per stream and with a hand-rolled HTTP/1.1 client; the client's own event-loop lag.
Prints, does not assert. The issue's target: median TTFT error ≤ 5 %. Last line:
`ttft_rel_err_median=`, the largest of the httpx cells' medians. About a minute.

    .venv/bin/python benchmarks/sim_timing_fidelity.py [--speedups 1 20] [--concurrency 8 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from autotuner.workload.client import shard_count

MODEL_ARGS = ["llama-2-7b", "--sim-gpu", "h100-80gb", "--gpu-memory-utilization", "0.85"]
PROMPT_TOKENS = (1000, 3000)
OUTPUT_TOKENS = 64
ROUNDS = {8: 4, 64: 1}  # requests per client: 32 requests at 8 streams, 64 at 64
LETTERS = "abcdefghijklmnopqrstuvwxyz"
CLIENTS = ("httpx-sharded", "httpx", "httpx-per-stream", "raw")


@dataclass
class Sample:
    id: str
    sent: float  # client perf_counter (CLOCK_MONOTONIC, shared with the server process)
    first: float
    done: float
    chunks: int


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill_group(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sim_server(speedup: float, workdir: Path, timeout: float = 90.0) -> Iterator[Server]:
    port = free_port()
    # A fresh simulated box per server: the last one's killed workers may still be releasing theirs.
    state = workdir / f"gpus-x{speedup:g}"
    env = dict(os.environ, AUTOTUNER_SIM_STATE_DIR=str(state), VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    argv = [sys.executable, "-m", "autotuner.sim", "serve", *MODEL_ARGS, "--sim-speedup", f"{speedup:g}",
            "--port", str(port)]
    log = workdir / f"sim-x{speedup:g}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"simulator exited {proc.returncode}:\n{log.read_text(errors='replace')}")
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"simulator not ready in {timeout:.0f} s")
            time.sleep(0.05)
        yield server
    finally:
        server.kill_group()


def make_prompt(rng: random.Random) -> str:
    n = rng.randint(*PROMPT_TOKENS)
    return " ".join("".join(rng.choices(LETTERS, k=4)) for _ in range(n))


async def one_request(client: httpx.AsyncClient, url: str, prompt: str) -> Sample:
    body = {"prompt": prompt, "max_tokens": OUTPUT_TOKENS, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = done = math.nan
    rid = ""
    chunks = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if not choices:
                continue  # the usage chunk
            rid = chunk["id"].removeprefix("cmpl-")
            chunks += 1
            if choices[0].get("text") and math.isnan(first):
                first = now
            if choices[0].get("finish_reason"):
                done = now
    return Sample(rid, sent, first, done, chunks)


async def raw_request(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], host: str,
                      prompt: str) -> Sample:
    """The same request over a kept-alive socket with hand-rolled HTTP/1.1 and SSE: the least a client
    can do, to tell the client's cost from the server's. Only chunks carrying text are decoded."""
    reader, writer = conn
    body = json.dumps({"prompt": prompt, "max_tokens": OUTPUT_TOKENS, "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sent = time.perf_counter()
    writer.write(head + body)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"HTTP status {status!r}")
    while await reader.readline() not in (b"\r\n", b""):
        pass  # headers
    first = done = math.nan
    rid = ""
    chunks = 0
    while True:
        line = await reader.readline()
        if not line:
            raise RuntimeError("connection closed mid-stream")
        if line == b"0\r\n":  # the last chunk of the chunked body
            await reader.readline()
            break
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        if b'"choices":[]' in line:
            continue  # the usage chunk
        chunks += 1
        if math.isnan(first) or b'"finish_reason":null' not in line:
            chunk = json.loads(line[6:])
            if "id" not in chunk:
                raise RuntimeError(f"unexpected event {line[:300]!r}")
            rid = chunk["id"].removeprefix("cmpl-")
            choice = chunk["choices"][0]
            if choice["text"] and math.isnan(first):
                first = now
            if choice["finish_reason"]:
                done = now
    return Sample(rid, sent, first, done, chunks)


async def loop_lag(stop: asyncio.Event, lags: list[float], period: float = 0.002) -> None:
    """How late this process's event loop wakes up: the client's own scheduling delay."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - t - period)


async def run_cell(
    url: str, concurrency: int, seed: int, kind: str
) -> tuple[list[Sample], float, list[float]]:
    """kind: httpx (one AsyncClient for all streams), httpx-per-stream (one AsyncClient, so one pooled
    connection, per stream) or raw (hand-rolled HTTP over one socket per stream)."""
    raw, per_stream_clients = kind == "raw", kind in ("httpx-per-stream", "httpx-sharded")
    rng = random.Random(seed)
    per_client = [[make_prompt(rng) for _ in range(ROUNDS.get(concurrency, 1))] for _ in range(concurrency)]
    lags: list[float] = []
    stop = asyncio.Event()
    if raw:
        host, port = url.removeprefix("http://").split(":")
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]
        try:
            await asyncio.gather(*(raw_request(c, f"{host}:{port}", "warm") for c in conns))
            ticker = asyncio.ensure_future(loop_lag(stop, lags))
            cpu0 = time.process_time()

            async def raw_loop(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                               prompts: list[str]) -> list[Sample]:
                return [await raw_request(conn, f"{host}:{port}", p) for p in prompts]

            results = await asyncio.gather(*(raw_loop(c, p) for c, p in zip(conns, per_client, strict=True)))
            cpu = time.process_time() - cpu0
        finally:
            for _, writer in conns:
                writer.close()
    elif per_stream_clients:
        # httpx-sharded is what the measurement client does (autotuner.workload.client): one
        # AsyncClient per STREAMS_PER_CLIENT streams.
        n = concurrency if kind == "httpx-per-stream" else shard_count(concurrency)
        shared = [httpx.AsyncClient(timeout=httpx.Timeout(300.0)) for _ in range(n)]
        clients = [shared[i % n] for i in range(concurrency)]
        try:
            await asyncio.gather(*(one_request(c, url, "warm") for c in clients))
            ticker = asyncio.ensure_future(loop_lag(stop, lags))
            cpu0 = time.process_time()

            async def own_loop(client: httpx.AsyncClient, prompts: list[str]) -> list[Sample]:
                return [await one_request(client, url, p) for p in prompts]

            results = await asyncio.gather(*(own_loop(c, p) for c, p in zip(clients, per_client, strict=True)))
            cpu = time.process_time() - cpu0
        finally:
            for c in shared:
                await c.aclose()
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:
            # Open every connection first: the cell measures the server, not TCP handshakes.
            await asyncio.gather(*(one_request(client, url, "warm") for _ in range(concurrency)))
            ticker = asyncio.ensure_future(loop_lag(stop, lags))
            cpu0 = time.process_time()

            async def loop(prompts: list[str]) -> list[Sample]:
                return [await one_request(client, url, p) for p in prompts]

            results = await asyncio.gather(*(loop(p) for p in per_client))
            cpu = time.process_time() - cpu0
    stop.set()
    await ticker
    return [s for per in results for s in per], cpu, lags


def rel_errors(client: list[float], scheduled: list[float]) -> list[float]:
    return [abs(c - s) / s for c, s in zip(client, scheduled, strict=True) if s > 0]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def analyse(samples: list[Sample], record: dict[str, object], client_cpu: float, wall: float,
            lags: list[float]) -> dict[str, float]:
    speedup = float(record["speedup"])  # type: ignore[arg-type]
    logged = {r["id"]: r for r in record["requests"]}  # type: ignore[attr-defined,union-attr]
    pairs = [(s, logged[s.id]) for s in samples if s.id in logged]
    if len(pairs) != len(samples):
        missing = len(samples) - len(pairs)
        raise RuntimeError(f"{missing} of {len(samples)} requests missing from /sim/requests")
    ttft_c = [(s.first - s.sent) * speedup for s, _ in pairs]
    ttft_s = [r["first_token_s"] - r["arrival_s"] for _, r in pairs]
    e2e_c = [(s.done - s.sent) * speedup for s, _ in pairs]
    e2e_s = [r["finished_s"] - r["arrival_s"] for _, r in pairs]
    ttft_err = rel_errors(ttft_c, ttft_s)
    e2e_err = rel_errors(e2e_c, e2e_s)
    # The server's clock: simulated = (perf_counter - wall0) * speedup, same CLOCK_MONOTONIC as ours.
    # wall0 ≥ sent - arrival/speedup for every request; the largest bound is the best estimate.
    wall0 = max(s.sent - r["arrival_s"] / speedup for s, r in pairs)
    submit = [(wall0 + r["arrival_s"] / speedup - s.sent) * 1e3 for s, r in pairs]
    deliver_first = [(s.first - wall0 - r["first_token_s"] / speedup) * 1e3 for s, r in pairs]
    deliver_last = [(s.done - wall0 - r["finished_s"] / speedup) * 1e3 for s, r in pairs]
    return {
        "n": len(pairs),
        "ttft_sched_med_s": statistics.median(ttft_s),
        "ttft_med": statistics.median(ttft_err), "ttft_p95": p95(ttft_err),
        "e2e_med": statistics.median(e2e_err), "e2e_p95": p95(e2e_err),
        "submit_med_ms": statistics.median(submit), "submit_max_ms": max(submit),
        "first_med_ms": statistics.median(deliver_first), "first_p95_ms": p95(deliver_first),
        "last_med_ms": statistics.median(deliver_last),
        "client_cpu_s": client_cpu, "wall_s": wall,
        "loop_lag_med_ms": statistics.median(lags) * 1e3 if lags else math.nan,
        "loop_lag_p95_ms": p95(lags) * 1e3 if lags else math.nan,
        "chunks_per_req": statistics.mean(s.chunks for s, _ in pairs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedups", type=float, nargs="+", default=[20.0, 1.0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS),
                        help="httpx-sharded: one AsyncClient per 8 streams, as the measurement client "
                        "does (the headline); httpx: one AsyncClient for all; httpx-per-stream: one per "
                        "stream; raw: hand-rolled HTTP/1.1 (the diagnostics tell the client's share)")
    args = parser.parse_args()

    t_start = time.monotonic()
    cells: list[tuple[str, int, float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="sim-fidelity-") as tmp:
        for speedup in args.speedups:
            t0 = time.monotonic()
            with sim_server(speedup, Path(tmp)) as server:
                print(f"speed-up {speedup:g}: server ready in {time.monotonic() - t0:.1f} s", flush=True)
                for kind in args.clients:
                    for concurrency in args.concurrency:
                        w0 = time.monotonic()
                        samples, cpu, lags = asyncio.run(
                            run_cell(server.url, concurrency, seed=concurrency, kind=kind))
                        wall = time.monotonic() - w0
                        record = httpx.get(server.url + "/sim/requests", timeout=10).json()
                        cells.append((kind, concurrency, speedup, analyse(samples, record, cpu, wall, lags)))

    print(f"\nsimulator: {' '.join(MODEL_ARGS)}; prompts {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens, "
          f"{OUTPUT_TOKENS} out, ignore_eos; closed loops, requests per client {ROUNDS}")
    print("errors: |client - scheduled| / scheduled; lags: wall ms, relative to the least-lagged request")
    header = ("client", "streams", "speedup", "n", "sched ttft med s", "ttft err med", "p95", "e2e err med",
              "p95", "submit lag med/max", "1st-tok lag med/p95", "last-tok lag med",
              "client loop lag med/p95", "chunks/req", "client cpu s", "wall s")
    rows = []
    for kind, concurrency, speedup, c in cells:
        rows.append((
            kind, str(concurrency), f"{speedup:g}", str(int(c["n"])), f"{c['ttft_sched_med_s']:.3f}",
            f"{100 * c['ttft_med']:.2f}%", f"{100 * c['ttft_p95']:.2f}%",
            f"{100 * c['e2e_med']:.2f}%", f"{100 * c['e2e_p95']:.2f}%",
            f"{c['submit_med_ms']:.1f} / {c['submit_max_ms']:.1f}",
            f"{c['first_med_ms']:.1f} / {c['first_p95_ms']:.1f}", f"{c['last_med_ms']:.1f}",
            f"{c['loop_lag_med_ms']:.2f} / {c['loop_lag_p95_ms']:.2f}",
            f"{c['chunks_per_req']:.1f}", f"{c['client_cpu_s']:.2f}", f"{c['wall_s']:.1f}",
        ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)))
    print(f"total wall {time.monotonic() - t_start:.1f} s; target: median TTFT error <= 5 %; "
          "the lines below are the largest cell medians")
    for kind in args.clients:
        if kind != "httpx-sharded":
            worst = max(c["ttft_med"] for k, _, _, c in cells if k == kind)
            print(f"ttft_rel_err_median_{kind.replace('-', '_')}={worst:.4f}")
    if "httpx-sharded" in args.clients:
        worst = max(c["ttft_med"] for k, _, _, c in cells if k == "httpx-sharded")
        print(f"ttft_rel_err_median={worst:.4f}")


if __name__ == "__main__":
    main()
