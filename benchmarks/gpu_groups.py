"""Trials per hour with GPU groups against one trial at a time (printed, not asserted).

    .venv/bin/python benchmarks/gpu_groups.py [--trials 8] [--speedup 20] [--seed 0]

The same study twice through the real `autotuner tune` command on the simulator (real engine processes
over HTTP): Llama-2-13B at tensor parallel 2 on 8 simulated RTX 3090s, the same trial budget and
sampler seed, once with `--gpu-groups auto` (4 trials at once on disjoint GPU pairs) and once with
`--gpu-groups off`. Each run gets its own simulated box, AUTOTUNER_HOME and SQLite file. Trials per
hour = engine runs (launched trials) / wall time of the whole `tune` command (start-up included).

Side by side, the engines share this machine's CPU cores (the simulator and the replay client are
Python processes), so the ratio is bounded by the cores available, not by the simulated GPUs: on a
2-core box it stays well below 4. On a real GPU box the engines mostly wait on their GPUs.

Last line: `trials_per_hour_groups=<ratio>` (groups / one at a time).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def scenario(trials: int, speedup: float) -> dict[str, object]:
    return {
        "name": "gpu-groups-bench",
        "engine": {"kind": "sim", "model": "llama-2-13b",
                   "flags": {"tensor-parallel-size": 2, "max-model-len": 4096},
                   "sim": {"gpu": "rtx-3090", "gpus": 8, "speedup": speedup, "noise": 0.03},
                   "startup_timeout_s": 120, "release_timeout_s": 30},
        "monitor": {"kind": "sim", "hz": 100},
        "workload": {"requests": {"count": 16, "prompt_tokens": {"kind": "uniform", "low": 1000, "high": 3000},
                                  "output_tokens": 64},
                     "arrivals": {"kind": "concurrency", "concurrency": 4}, "warmup_requests": 1,
                     "max_duration_s": 120},
        "slos": {"ttft_p95_s": 10.0},
        "search_space": {"max-num-batched-tokens": {"type": "int", "low": 512, "high": 16384, "log": True},
                         "gpu-memory-utilization": {"type": "float", "low": 0.85, "high": 0.97, "step": 0.01}},
        "budget": {"trials": trials},
    }


@dataclass
class Run:
    groups: str
    wall_s: float
    launched: int
    ooms: int
    trial_s: list[float]

    @property
    def per_hour(self) -> float:
        return self.launched / self.wall_s * 3600 if self.wall_s else 0.0


def run_tune(groups: str, trials: int, speedup: float, seed: int, work: Path) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario(trials, speedup)))
    db = work / "study.db"
    env = {**os.environ, "AUTOTUNER_HOME": str(work / "home"), "AUTOTUNER_SIM_STATE_DIR": str(work / "gpus")}
    argv = [sys.executable, "-m", "autotuner", "tune", str(path), "--storage", str(db), "--confirm", "0",
            "--seed", str(seed), "--gpu-groups", groups, "--quiet"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"tune --gpu-groups {groups} exited {done.returncode}:\n{done.stderr[-3000:]}")
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select t.number, t.datetime_start, t.datetime_complete, "
            "(select value_json from trial_user_attributes a where a.trial_id = t.trial_id and a.key = 'outcome'), "
            "(select value_json from trial_user_attributes a where a.trial_id = t.trial_id and a.key = 'launched') "
            "from trials t where t.state = 'COMPLETE'").fetchall()
    launched = [r for r in rows if r[4] != "false"]
    durations = []
    for _, start, end, _, _ in launched:
        if start and end:
            durations.append(_parse(end) - _parse(start))
    ooms = sum(1 for r in launched if r[3] and "oom" in r[3])
    return Run(groups, wall, len(launched), ooms, durations)


def _parse(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def trials_per_hour_ratio(trials: int = 8, speedup: float = 20.0, seed: int = 0, verbose: bool = True) -> float:
    """Trials per hour with GPU groups (auto: 4 × TP 2 on 8 GPUs) / without, on the simulator."""
    with tempfile.TemporaryDirectory(prefix="gpu-groups-bench-") as tmp:
        runs = [run_tune(groups, trials, speedup, seed, Path(tmp) / groups) for groups in ("auto", "off")]
    if verbose:
        print(f"{'groups':>6} {'trials':>6} {'OOM':>4} {'wall s':>8} {'trials/h':>9} {'median trial s':>15}")
        for r in runs:
            median = statistics.median(r.trial_s) if r.trial_s else float("nan")
            print(f"{r.groups:>6} {r.launched:>6} {r.ooms:>4} {r.wall_s:>8.1f} {r.per_hour:>9.0f} {median:>15.1f}")
        print(f"cpu cores: {os.cpu_count()}; a trial's engine time grows side by side when the cores are shared")
    with_groups, alone = runs
    return with_groups.per_hour / alone.per_hour if alone.per_hour else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ratio = trials_per_hour_ratio(args.trials, args.speedup, args.seed)
    print(f"trials_per_hour_groups={ratio:.2f}")


if __name__ == "__main__":
    main()
