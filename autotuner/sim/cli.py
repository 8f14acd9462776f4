"""`autotuner sim serve` and `autotuner sim evaluate`: command lines parsed like `vllm serve`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from autotuner.errors import UserInputError
from autotuner.sim.args import VllmArgError, build_config, new_parser, parse_args
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, config_summary, evaluate

GIB = float(1 << 30)


def _token_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI or N, got {text!r}") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"expected 1 ≤ LO ≤ HI, got {text!r}")
    return a, b


def evaluate_parser() -> argparse.ArgumentParser:
    # The workload's --seed takes the place of vLLM's sampling --seed, which evaluation has no use for.
    parser = new_parser(prog="autotuner sim evaluate", conflict_handler="resolve")
    wl = parser.add_argument_group("workload")
    wl.add_argument("--prompts", type=int, default=32, help="number of requests")
    wl.add_argument("--prompt-tokens", type=_token_range, default=(3000, 6000), help="LO-HI, uniform")
    wl.add_argument("--output-tokens", type=int, default=256)
    arrivals = wl.add_mutually_exclusive_group()
    arrivals.add_argument("--concurrency", type=int, help="closed loop of C clients (default 8)")
    arrivals.add_argument("--rate", type=float, help="Poisson arrivals, requests per second")
    wl.add_argument("--seed", type=int, default=0, help="workload seed")
    wl.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def run_evaluate(argv: Sequence[str]) -> int:
    parser = evaluate_parser()
    try:
        ns = parse_args(argv, parser)
        if ns.prompts < 1 or ns.output_tokens < 1 or (ns.concurrency is not None and ns.concurrency < 1):
            parser.error("--prompts, --output-tokens and --concurrency must be ≥ 1")
        if ns.rate is not None and ns.rate <= 0:
            parser.error("--rate must be > 0")
    except VllmArgError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    workload = SyntheticWorkload(
        prompts=ns.prompts,
        prompt_tokens=ns.prompt_tokens,
        output_tokens=ns.output_tokens,
        concurrency=None if ns.rate else (ns.concurrency or 8),
        rate=ns.rate,
        seed=ns.seed,
    )
    try:
        config = build_config(ns)
    except VllmArgError as exc:
        if exc.exit_code == 2:
            print(exc.message, file=sys.stderr)
            return 2
        result = Evaluation("invalid-flags", exc.message)
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    else:
        result = evaluate(config, workload.requests(config.model.vocab_size), workload.concurrency)
        result.config = config_summary(config)
    if ns.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print_evaluation(result)
    return 0


def print_evaluation(ev: Evaluation) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    style = {"ok": "green", "oom": "red"}.get(ev.outcome, "yellow")
    headline = f"[bold {style}]{ev.outcome}[/]"
    if ev.oom_at_s is not None:
        headline += f" at {ev.oom_at_s:.2f} s (simulated)"
    console.print(headline)
    if ev.reason:
        console.print(ev.reason, markup=False, highlight=False)
    if ev.config:
        console.print(", ".join(f"{k}={v}" for k, v in ev.config.items()), highlight=False)
    if not ev.metrics:
        return
    table = Table(title="simulated hardware time")
    table.add_column("metric")
    table.add_column("value", justify="right")
    m = ev.metrics
    for key in ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s"):
        table.add_row(key, f"{m[key]:.2f}")
    for name in ("ttft", "tpot", "e2e"):
        values = [m.get(f"{name}_p{q}_s") for q in (50, 90, 95, 99)]
        shown = " / ".join("-" if v is None else f"{v:.3f}" for v in values)
        table.add_row(f"{name} p50/p90/p95/p99 (s)", shown)
    table.add_row("completed / failed", f"{m['completed']} / {m['failed']}")
    peaks = ev.memory.get("peak_bytes", [])
    if isinstance(peaks, list) and peaks:
        table.add_row("memory peak per GPU (GiB)", " ".join(f"{p / GIB:.2f}" for p in peaks))
        table.add_row("memory peak fraction", f"{ev.memory['peak_fraction']:.3f}")
    table.add_row("KV cache tokens", f"{ev.kv_cache_tokens:,}")
    table.add_row("preemptions", str(ev.preemptions))
    console.print(table)
    console.print(ev.accuracy, highlight=False)


def run_serve(argv: Sequence[str]) -> int:
    from autotuner.sim.gpu_state import state_dir_from_env
    from autotuner.sim.main import serve

    try:
        ns = parse_args(argv)
        config = build_config(ns)
        state_dir_from_env()  # a symlinked or foreign state directory: refused before anything starts
    except VllmArgError as exc:
        print(exc.message, file=sys.stderr)
        return exc.exit_code
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def hold_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotuner sim hold",
        description="Hold simulated GPU memory as a process the tuner did not start (a desktop, someone "
                    "else's job) until killed.")
    parser.add_argument("--gpu", type=int, required=True, help="simulated GPU index")
    parser.add_argument("--mib", type=int, required=True, help="MiB to hold")
    parser.add_argument("--name", default="foreign", help="label in the holder file")
    parser.add_argument("--unlisted", action="store_true",
                        help="hide from NVML's process list, as seen from a container without host PIDs")
    return parser


def run_hold(argv: Sequence[str]) -> int:
    """Hold `--mib` on simulated GPU `--gpu` until SIGTERM/SIGINT/SIGKILL; prints one line once held."""
    import signal

    from autotuner.sim.gpu_state import HOLDERS_DIR, GpuHost, state_dir_from_env
    from autotuner.sim.worker_process import HolderFile, start_heartbeat

    parser = hold_parser()
    ns = parser.parse_args(list(argv))
    if ns.gpu < 0 or ns.mib < 0:
        parser.error("--gpu and --mib must be ≥ 0")
    try:
        state = state_dir_from_env()
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gpus = GpuHost(state).inventory()
    if gpus and ns.gpu >= len(gpus):
        print(f"error: --gpu {ns.gpu}: the simulated box has GPUs 0-{len(gpus) - 1}", file=sys.stderr)
        return 2
    # Before the first engine, the box has no inventory yet: the holder waits for the GPU to appear.
    (state / HOLDERS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
    holder = HolderFile(state, ns.gpu, ns.name, listed=not ns.unlisted)
    holder.hold(ns.mib << 20)
    start_heartbeat(holder)
    print(f"holding {ns.mib} MiB on simulated GPU {ns.gpu} as pid {holder.pid}"
          f"{' (not listed)' if ns.unlisted else ''}; stop with kill {holder.pid}", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    while True:
        signal.pause()
