"""What each weight-offload backend buys where offload is needed (printed, not asserted).

    .venv/bin/python benchmarks/offload_modes.py [--quick]

Three model/GPU pairs whose weights do not fit without offload, each on the simulator's engine core
in virtual time (`VirtualRunner`, noise 0, deterministic):
- 13b-4090: Llama-2-13B (24.2 GiB fp16) on one RTX 4090, TP 1;
- 70b-5090x4: Llama-2-70B (128 GiB) on 4× RTX 5090 (31.4 GiB each), TP 4;
- 8b-16gb: Qwen3-8B (15.3 GiB bf16) on one 16 GB card with PCIe 4.0 x8 (an RTX 4060 Ti 16GB-class
  GPU, described here: 15.7 GiB, 288 GB/s, 22 TFLOP/s, 12 GB/s host link).

For each, a grid over the budget (1024, 4096), utilization (0.84, 0.90) and GiB freed per GPU
(0.5 … 12) — the offload axis of the search space (`offload-mode`, `offload-gib`,
autotuner/trials/offload_axis.py) — and the best output throughput among the points that meet the
scenario's SLO (TTFT p95), with: no offload, UVA only (`--cpu-offload-gb`), and UVA or prefetch
(`--offload-backend prefetch` with G, K, S planned from the GiB). A grid, not the tuner: the question
is what the backends allow, not how fast a sampler finds it.

Last line: `uva_over_none=<x> prefetch_over_uva=<x>`, medians over the pairs; a pair where nothing
without offload starts counts as `inf` for the first (0 tok/s without offload).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
from pathlib import Path

from autotuner.scenario import Scenario
from autotuner.trials import offload_axis
from autotuner.trials.scoring import constraints_of, feasible
from autotuner.tuner.runners import VirtualRunner
from autotuner.tuner.space import offload_limit_gib, offload_shape
from autotuner.vllm import FlagValue

GPU_16GB = """name: pcie-16gb
product_name: NVIDIA GeForce RTX 4060 Ti
memory_gib: 15.7
bandwidth_gbps: 288
fp16_tflops: 22
pcie_gbps: 12
nvlink_gbps: 0
"""


def scenario(name: str, model: str, gpu: str, tp: int, max_len: int, concurrency: int, ttft_s: float) -> Scenario:
    return Scenario.model_validate({
        "name": name,
        "engine": {"kind": "sim-virtual", "model": model,
                   "flags": {"max-model-len": max_len, "tensor-parallel-size": tp},
                   "sim": {"gpu": gpu, "gpus": tp, "noise": 0}},
        "oom_threshold": {"fraction": 0.97},
        # Decode-heavy chat: short prompts, long answers.
        "workload": {"requests": {"count": 24, "prompt_tokens": {"kind": "uniform", "low": 200, "high": 800},
                                  "output_tokens": 256},
                     "arrivals": {"kind": "concurrency", "concurrency": concurrency}, "warmup_requests": 1,
                     "seed": 1},
        "slos": {"ttft_p95_s": ttft_s},
    })


def pairs(gpu_dir: Path) -> list[Scenario]:
    gpu16 = gpu_dir / "pcie-16gb.yaml"
    gpu16.write_text(GPU_16GB)
    return [scenario("13b-4090", "llama-2-13b", "rtx-4090", 1, 4096, 8, 30.0),
            scenario("70b-5090x4", "llama-2-70b", "rtx-5090", 4, 4096, 16, 60.0),
            scenario("8b-16gb", "qwen3-8b", str(gpu16), 1, 4096, 8, 30.0)]


def best(runner: VirtualRunner, sc: Scenario, points: list[dict[str, FlagValue]]) -> tuple[float, str]:
    top, where = 0.0, "nothing meets the SLO"
    for flags in points:
        result = runner.evaluate(flags)
        tput = result.metrics.get("output_tokens_per_s")
        if result.outcome == "ok" and feasible(constraints_of(result, sc)) and tput is not None and tput > top:
            top, where = float(tput), " ".join(f"{k}={v}" for k, v in flags.items())
    return top, where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    budgets = [2048] if args.quick else [1024, 4096]
    utils = [0.88] if args.quick else [0.84, 0.90]
    gibs = [1.0, 2.0, 4.0, 8.0] if args.quick else [0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    uva_over_none: list[float] = []
    prefetch_over_uva: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for sc in pairs(Path(tmp)):
            runner = VirtualRunner(sc)
            shape = offload_shape(sc)
            limit = offload_limit_gib(sc)
            base = [{"max-num-batched-tokens": b, "gpu-memory-utilization": u} for b in budgets for u in utils]
            grid = [g for g in gibs if g <= limit]
            none = best(runner, sc, base)
            uva = best(runner, sc, [{**p, **offload_axis.to_flags("uva", g, shape)} for p in base for g in grid])
            pre = best(runner, sc, [{**p, **offload_axis.to_flags("prefetch", g, shape)} for p in base for g in grid])
            either = max(uva, pre)
            print(f"{sc.name}: none {none[0]:.1f} tok/s ({none[1]})", flush=True)
            print(f"  uva only {uva[0]:.1f} tok/s ({uva[1]})")
            print(f"  uva or prefetch {either[0]:.1f} tok/s ({either[1]}); prefetch alone {pre[0]:.1f} tok/s")
            uva_over_none.append(uva[0] / none[0] if none[0] > 0 else math.inf)
            prefetch_over_uva.append(either[0] / uva[0] if uva[0] > 0 else math.inf)
            print(f"  uva/none {uva_over_none[-1]:.2f}  (uva or prefetch)/uva {prefetch_over_uva[-1]:.2f}  "
                  f"[{runner.runs} simulated runs]")
    print(f"uva_over_none={statistics.median(uva_over_none):.2f} "
          f"prefetch_over_uva={statistics.median(prefetch_over_uva):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
