"""Per-trial overhead of the study loop on the simulator at speed-up 10 (printed, not asserted).

    .venv/bin/python benchmarks/trial_overhead.py [--trials 6]

A real study (`Tuner` + `MeasureRunner`, the simulator as a process over HTTP, simulated NVML, SQLite)
on the quickstart scenario with a short workload. Per launched trial, from the loop's own events:
the whole trial (from the candidate's `trial` event to the next one, or the end), the engine's part
(from phase `starting` to phase `stopping`: engine start, warm-up and workload), and the overhead =
whole − engine part: asking the sampler, flag checks, the memory model, stopping the engine, waiting
for its memory to come back, saving. Target: ≤ 1 s per trial. Candidates not launched (oom-predicted,
invalid flags) are all overhead and listed apart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import structlog
import yaml

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        os.environ["AUTOTUNER_HOME"] = f"{tmp}/home"
        os.environ["AUTOTUNER_SIM_STATE_DIR"] = f"{tmp}/gpus"
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        from autotuner.scenario import load_scenario
        from autotuner.store.db import Store
        from autotuner.tuner.runners import MeasureRunner
        from autotuner.tuner.study import Tuner

        data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
        data["engine"]["sim"]["speedup"] = 10
        data["workload"]["requests"].update(count=8, output_tokens=32)
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(data))
        scenario = load_scenario(path)
        events: list[tuple[float, str, dict[str, Any]]] = []
        store = Store(f"{tmp}/study.db")
        tuner = Tuner(scenario, MeasureRunner(scenario, Path(tmp) / "logs"), store, n_trials=args.trials, seed=0,
                      on_event=lambda kind, data: events.append((time.perf_counter(), kind, data)))
        t0 = time.perf_counter()
        asyncio.run(tuner.run())
        end = time.perf_counter()

    starts = [i for i, (_, kind, _) in enumerate(events) if kind == "trial"]
    launched, skipped = [], []
    parts: list[tuple[float, float, float]] = []  # before start, stop to saved, saved to next ask
    for j, i in enumerate(starts):
        stop = starts[j + 1] if j + 1 < len(starts) else len(events)
        span = events[i:stop]
        whole = (events[stop][0] if stop < len(events) else end) - events[i][0]
        phases = {d.get("phase"): t for t, kind, d in span if kind == "phase"}
        finished = next((t for t, kind, _ in span if kind == "finished"), None)
        if "starting" in phases and "stopping" in phases and finished is not None:
            launched.append((whole, whole - (phases["stopping"] - phases["starting"])))
            parts.append((phases["starting"] - events[i][0], finished - phases["stopping"],
                          events[i][0] + whole - finished))
        else:
            skipped.append(whole)
    print(f"{len(launched)} launched trials in {end - t0:.1f} s on the simulator at speed-up 10")
    for n, ((whole, overhead), (before, stopping, after)) in enumerate(zip(launched, parts, strict=True)):
        print(f"  trial {n}: {whole:6.2f} s in all, overhead {overhead:5.2f} s = {before:.2f} before the engine "
              f"starts + {stopping:.2f} stopping, memory release and saving + {after:.2f} to the next candidate")
    if skipped:
        print(f"  not launched: {len(skipped)}, {statistics.mean(skipped):.3f} s each (all overhead)")
    overheads = [o for _, o in launched]
    print(f"overhead per launched trial: median {statistics.median(overheads):.2f} s, max {max(overheads):.2f} s "
          f"(target <= 1 s)")


if __name__ == "__main__":
    main()
