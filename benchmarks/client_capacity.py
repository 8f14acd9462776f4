"""How much streaming one client process can take: measured, not asserted.

Starts the simulator at a large speed-up (so the engine is never what limits), replays short
prompts with many output tokens at a fixed concurrency, and prints, as medians of several runs:
requests/s and streamed tokens/s as the client measured them, SSE chunks/s, the client process's
CPU use, and the ratio of the client-measured token rate to the rate the engine scheduled
(`/sim/requests`). A ratio near 1 with CPU to spare means the client is not the bottleneck.

    .venv/bin/python benchmarks/client_capacity.py [--speedup 1000] [--concurrency 64] ...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx

from autotuner.workload.client import StreamingClient, http_client
from autotuner.workload.replay import replay
from autotuner.workload.requests import build_requests
from autotuner.workload.spec import Arrivals, LengthDist, SyntheticRequests, WorkloadSpec

MODEL = "llama-2-13b"


@dataclass
class Run:
    requests_per_s: float
    tokens_per_s: float
    chunks_per_s: float
    cpu_fraction: float  # client process CPU seconds / wall seconds
    engine_tokens_per_s: float  # as scheduled by the engine, in wall seconds
    failed: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_simulator(speedup: float, state_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "AUTOTUNER_SIM_STATE_DIR": state_dir, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    argv = [sys.executable, "-m", "autotuner.sim", "serve", MODEL, "-tp", "8", "--max-model-len", "8192",
            "--max-num-seqs", "512", "--sim-speedup", str(speedup), "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"simulator exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("simulator not ready in 60 s")


async def one_run(url: str, args: argparse.Namespace, seed: int) -> Run:
    syn = SyntheticRequests(args.requests, LengthDist("fixed", value=args.prompt_tokens),
                            LengthDist("fixed", value=args.output_tokens))
    spec = WorkloadSpec(syn, Arrivals("concurrency", concurrency=args.concurrency, time_scale=args.speedup),
                        seed=seed)
    async with http_client() as http:
        built = await build_requests(spec, http, url, MODEL)
        client = StreamingClient(http, url, MODEL)
        cpu0 = time.process_time()
        result = await replay(spec, built.requests, client)
        cpu = time.process_time() - cpu0
        engine = (await http.get(url + "/sim/requests")).json()["requests"]
    ok = [r for r in result.results if r.ok]
    span = max(r.finished_at for r in ok) - min(r.sent_at or 0.0 for r in result.results)
    tokens = sum(r.output_tokens for r in ok)
    chunks = sum(len(r.itl_s) + 1 for r in ok)
    ids = {r.request_id.split("-", 1)[1] for r in ok if r.request_id}
    mine = [e for e in engine if e["id"] in ids]
    engine_span = (max(e["finished_s"] for e in mine) - min(e["arrival_s"] for e in mine)) / args.speedup
    engine_tokens = sum(e["output_tokens"] for e in mine)
    return Run(len(ok) / span, tokens / span, chunks / span, cpu / result.duration_s,
               engine_tokens / engine_span, len(result.results) - len(ok))


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as state:
        proc, url = start_simulator(args.speedup, state)
        try:
            runs = [await one_run(url, args, seed) for seed in range(args.runs)]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def med(field: str) -> float:
        return statistics.median(getattr(r, field) for r in runs)

    print(f"client capacity: {args.requests} requests × ({args.prompt_tokens} in, {args.output_tokens} out), "
          f"concurrency {args.concurrency}, simulator speed-up {args.speedup:g}, medians of {args.runs} runs")
    print(f"  requests/s (client)          {med('requests_per_s'):10.1f}")
    print(f"  tokens/s streamed (client)   {med('tokens_per_s'):10.0f}")
    print(f"  SSE chunks/s (client)        {med('chunks_per_s'):10.0f}")
    print(f"  tokens/s scheduled (engine)  {med('engine_tokens_per_s'):10.0f}")
    ratios = [r.tokens_per_s / r.engine_tokens_per_s for r in runs]
    print(f"  client / engine token rate   {statistics.median(ratios):10.3f}")
    print(f"  client CPU (fraction of one core) {med('cpu_fraction'):5.2f}")
    cpu_per_chunk = statistics.median(r.cpu_fraction / r.chunks_per_s for r in runs)
    print(f"  client CPU per chunk         {cpu_per_chunk * 1e6:10.1f} µs  "
          f"(→ ~{1 / cpu_per_chunk:,.0f} chunks/s on one core)")
    print(f"  failed requests              {sum(r.failed for r in runs):10d}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speedup", type=float, default=1000.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
