"""How fast the simulator evaluates one configuration offline (virtual time, no sleeping).

Workload: 200 long-prompt requests (3000-6000 prompt tokens, 256 output tokens, ignore_eos) on
Llama-2-13B, TP 8, 8x RTX 3090, --max-model-len 8192; a closed loop of 8 clients, and a Poisson
variant whose rate keeps ~64 requests in the engine on average (running + waiting: the KV cache holds
only ~35-40 such prompts, so not all 64 can run at once).
Two flag sets: vLLM's defaults, and `--max-num-batched-tokens 1024 --gpu-memory-utilization 0.8`.

Measured: CPU seconds (time.process_time) of one evaluation (config, workload, evaluate), median of
5, imports excluded; engine steps per CPU second. Prints, does not assert. The issue's target is
≤ 2 s of CPU per evaluation. The last line, `sim_eval_cpu_s=`, is the largest of the cells' medians.

    .venv/bin/python benchmarks/sim_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")

import autotuner.sim.evaluate as sim_evaluate
from autotuner.sim.args import EngineConfig, build_config, parse_args
from autotuner.sim.core import EngineCore, StepResult
from autotuner.sim.evaluate import Evaluation, SyntheticWorkload, evaluate

BASE = ["llama-2-13b", "--tensor-parallel-size", "8", "--sim-gpu", "rtx-3090", "--max-model-len", "8192"]
FLAG_SETS: dict[str, list[str]] = {
    "defaults": [],
    "mbt1024,gmu0.8": ["--max-num-batched-tokens", "1024", "--gpu-memory-utilization", "0.8"],
}
PROMPTS = 200
PROMPT_TOKENS = (3000, 6000)
OUTPUT_TOKENS = 256
IN_FLIGHT_TARGET = 64


@dataclass
class StepStats:
    steps: int = 0
    busy_s: float = 0.0  # simulated seconds covered by steps
    in_flight_s: float = 0.0  # ∫ (running + waiting) dt over steps, simulated
    running_s: float = 0.0  # ∫ running dt


def config_for(flags: list[str]) -> EngineConfig:
    return build_config(parse_args([*BASE, *flags]))


def run_once(flags: list[str], workload: SyntheticWorkload) -> Evaluation:
    config = config_for(flags)
    return evaluate(config, workload.requests(config.model.vocab_size), workload.concurrency)


def cpu_seconds(
    flags: list[str], workload: SyntheticWorkload, repeats: int
) -> tuple[list[float], Evaluation]:
    times: list[float] = []
    result: Evaluation | None = None
    for _ in range(repeats):
        t0 = time.process_time()
        result = run_once(flags, workload)
        times.append(time.process_time() - t0)
    assert result is not None
    return times, result


def count_steps(flags: list[str], workload: SyntheticWorkload) -> StepStats:
    """An untimed run with a counting core: steps, and time-averaged occupancy."""
    stats = StepStats()

    class CountingCore(EngineCore):
        def step(self, now: float) -> StepResult:
            in_flight = len(self.running) + len(self.waiting)
            result = super().step(now)
            stats.steps += 1
            stats.busy_s += result.duration
            stats.in_flight_s += in_flight * result.duration
            stats.running_s += len(self.running) * result.duration
            return result

    original = sim_evaluate.EngineCore
    sim_evaluate.EngineCore = CountingCore  # type: ignore[misc]
    try:
        run_once(flags, workload)
    finally:
        sim_evaluate.EngineCore = original  # type: ignore[misc]
    return stats


def poisson(flags: list[str], rate: float) -> SyntheticWorkload:
    return SyntheticWorkload(PROMPTS, PROMPT_TOKENS, OUTPUT_TOKENS, concurrency=None, rate=rate)


def poisson_rate(flags: list[str]) -> float:
    """The Poisson rate whose time-averaged number of requests in the engine (running + waiting) is
    IN_FLIGHT_TARGET, by bisection on untimed runs. The start is the throughput of a closed loop of
    IN_FLIGHT_TARGET clients (Little's law); with 200 requests the ramp-up and drain pull the average
    down, so the rate that reaches it is higher."""
    closed = SyntheticWorkload(PROMPTS, PROMPT_TOKENS, OUTPUT_TOKENS, concurrency=IN_FLIGHT_TARGET)
    start = run_once(flags, closed).metrics["requests_per_s"]
    assert isinstance(start, float)
    lo, hi = start / 2, start * 8
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        stats = count_steps(flags, poisson(flags, mid))
        if stats.in_flight_s / (stats.busy_s or 1e-9) < IN_FLIGHT_TARGET:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rows: list[tuple[str, ...]] = []
    medians: list[float] = []
    for name, flags in FLAG_SETS.items():
        rate = poisson_rate(flags)
        workloads = {
            "closed c=8": SyntheticWorkload(PROMPTS, PROMPT_TOKENS, OUTPUT_TOKENS, concurrency=8),
            f"poisson {rate:.3f}/s": poisson(flags, rate),
        }
        for label, workload in workloads.items():
            times, result = cpu_seconds(flags, workload, args.repeats)
            stats = count_steps(flags, workload)
            med = statistics.median(times)
            medians.append(med)
            busy = stats.busy_s or 1e-9
            sim_s = result.metrics.get("duration_s") or 0.0
            rows.append((
                name, label, result.outcome, f"{med:.3f}", f"{min(times):.3f}", f"{max(times):.3f}",
                str(stats.steps), f"{stats.steps / med:,.0f}", f"{float(sim_s):.1f}",
                f"{float(sim_s) / med:,.0f}", f"{stats.running_s / busy:.1f}",
                f"{stats.in_flight_s / busy:.1f}",
                str(result.preemptions),
            ))
    header = ("flags", "workload", "outcome", "cpu_s med", "min", "max", "steps", "steps/cpu_s",
              "sim_s", "sim_s/cpu_s", "avg running", "avg in flight", "preempt")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"sim evaluate: {PROMPTS} requests, prompts {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens, "
          f"{OUTPUT_TOKENS} out; {' '.join(BASE)}; median of {args.repeats} (time.process_time)")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print("target: <= 2 s of CPU per evaluation; the line below is the largest cell median")
    print(f"sim_eval_cpu_s={max(medians):.3f}")


if __name__ == "__main__":
    main()
