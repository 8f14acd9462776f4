"""Runs the steps, each in its own process group inside its time box, sharing ``--total-s``; the
child side (``run_step_child``) records into its JSON-lines file, the parent reads back a ``StepResult``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from tools.gpu_check.children import repository_env, self_command
from tools.gpu_check.config import CheckConfig
from tools.gpu_check.records import Recorder, StepResult, read_records
from tools.gpu_check.report import LOG_NAME, build_report, write_report
from tools.gpu_check.step_nvml import step_nvml
from tools.gpu_check.step_oom import step_oom
from tools.gpu_check.step_wall import step_wall

SUMMARY_RESERVE_S = 8.0  # kept back from the last step for the simulator's predictions and the files
MIN_STEP_S = 5.0


def run_step_child(config: CheckConfig, step: str, results: Path, home: Path, deadline: float) -> int:
    rec = Recorder(results)
    rec.set("pid", os.getpid())
    try:
        if step == "nvml":
            step_nvml(config, rec)
        elif step == "wall":
            step_wall(config, rec, deadline)
        else:
            step_oom(config, rec, deadline, home)
        if config.stall == step:  # the time box's own test: overrun it after recording the figures
            time.sleep(3600)
    except Exception as exc:
        rec.set("error", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return 1
    finally:
        rec.close()
    return 0


def run_step(config: CheckConfig, step: str, box_s: float, work: Path, log: Any) -> StepResult:
    from autotuner.engine.registry import EngineRegistry

    results = work / f"{step}.jsonl"
    home = work / f"{step}-home"
    home.mkdir(exist_ok=True)
    deadline = time.time() + box_s
    cfg_path = work / "config.json"
    argv = self_command("_step", step, "--config", str(cfg_path), "--results", str(results), "--home", str(home),
                        "--deadline", f"{deadline:.3f}")
    log.write(f"=== step {step} (box {box_s:.0f} s)\n")
    log.flush()
    t = time.perf_counter()
    # CUDA numbers GPUs as NVML does (by PCI bus), so that --gpu-index names one card for both.
    env = repository_env({**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    status = "ok"
    try:
        rc = proc.wait(timeout=box_s)
        if rc != 0:
            status = "error"
    except subprocess.TimeoutExpired:
        status = "timeout"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # A killed step's children (the hog) live in their own groups: stop them as a crashed tuner's are.
    EngineRegistry(home).reap_orphans(grace_s=1.0)
    seconds = time.perf_counter() - t
    records = read_records(results)
    note = records["facts"].get("error", "") if status == "error" else ""
    if status == "timeout":
        note = f"killed at its {box_s:.0f} s box; figures recorded before that are kept"
    return StepResult(step, status, seconds, box_s, records["facts"], records["tables"], note)


def setup_dry_run(work: Path, config: CheckConfig) -> None:
    """A private simulated GPU (the configured GPU description) for the dry run's NVML."""
    from autotuner.catalog.gpus import load_gpu
    from autotuner.sim.gpu_state import STATE_DIR_ENV, GpuHost, make_gpus

    gpu = load_gpu(config.gpu_spec)
    state = work / "gpus"
    GpuHost(state).ensure_inventory(make_gpus(state, gpu.product_name, gpu.memory_bytes, config.gpu_index + 1))
    os.environ[STATE_DIR_ENV] = str(state)


def run_check(config: CheckConfig) -> dict[str, Any]:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    end = started + config.total_s
    steps: list[StepResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, open(out / LOG_NAME, "w") as log:
        work = Path(tmp)
        (work / "config.json").write_text(config.to_json())
        if config.dry_run:
            setup_dry_run(work, config)
        for i, step in enumerate(config.steps):
            left = end - time.time() - SUMMARY_RESERVE_S
            # Leave each later step at least its minimum, so one overrun cannot starve the rest.
            later = len(config.steps) - i - 1
            box = min(config.box_s[step], left - later * MIN_STEP_S)
            if box < MIN_STEP_S:
                steps.append(StepResult(step, "skipped", 0.0, 0.0, {}, {}, "no time left in --total-s"))
                continue
            result = run_step(config, step, box, work, log)
            print(f"step {step}: {result.status} in {result.seconds:.1f} s {result.note}".rstrip(), flush=True)
            steps.append(result)
    report = build_report(config, steps, started)
    write_report(out, report)
    return report
