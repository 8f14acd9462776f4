"""Step 3, ``oom``: the OOM path: a child (the hog, started through ``EngineProcess``) grows toward
the total until our threshold kills its group; then one that allocates until a real OutOfMemoryError,
its log through our classifier.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from tools.gpu_check.children import repository_env, self_command
from tools.gpu_check.config import GIB, MIB, CheckConfig
from tools.gpu_check.device import DeviceOutOfMemoryError
from tools.gpu_check.gpu_access import open_device, open_nvml, wait_idle
from tools.gpu_check.records import Recorder


def step_oom(config: CheckConfig, rec: Recorder, deadline: float, home: Path) -> None:
    from autotuner.engine.classify import classify
    from autotuner.engine.process import EngineProcess
    from autotuner.engine.registry import EngineRegistry
    from autotuner.monitor import Sampler, Threshold, ThresholdEvent, wait_for_release

    registry = EngineRegistry(home)
    env = repository_env({**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                          "CUDA_VISIBLE_DEVICES": str(config.gpu_index)})
    child = self_command("_hog", "--config-json", config.to_json())
    monitor = open_nvml(config)
    with monitor:
        total = monitor.devices()[0].total_bytes
        wait_idle(monitor, rec)
        baseline = monitor.sample()
        tolerance = 256 * MIB

        # 3a: the threshold trips, the group is killed.
        proc = EngineProcess([*child, "--mode", "grow"], env, home / "hog-grow.log", registry)
        marks: dict[str, float] = {}

        def on_threshold(event: ThresholdEvent) -> None:
            marks["callback"] = time.perf_counter()
            marks["callback_wall"] = time.time()
            proc.kill_now()
            marks["killed"] = time.perf_counter()

        sampler = Sampler(monitor, hz=200.0, threshold=Threshold.of_total(config.threshold_fraction),
                          on_threshold=on_threshold)
        t0 = time.perf_counter()
        sampler.start()
        proc.start()
        limit = min(deadline - 20, time.time() + 60)
        while proc.returncode is None and time.time() < limit:
            time.sleep(0.001)
        exited = time.perf_counter()
        event = sampler.threshold_event
        if event is None or "killed" not in marks:
            sampler.stop()
            proc.stop(grace_s=2)
            rec.set("trip", {"tripped": False, "returncode": proc.returncode, "log_tail": proc.log_tail(20)})
            raise RuntimeError("the threshold never tripped: see the hog's log tail")
        released = wait_for_release(monitor, baseline, tolerance, timeout=30.0, interval_s=0.002)
        released_at = time.perf_counter()
        summary = sampler.stop()
        gone = proc.stop(grace_s=2)
        sample_at = t0 + event.t_s
        grow_log = (home / "hog-grow.log").read_text(errors="replace").splitlines()
        grow_lines = [line.split() for line in grow_log if line.startswith("held ")]
        # The allocation that crossed is the child's last one logged before the callback ran.
        crossing = [float(p[2]) for p in grow_lines if len(p) == 3 and float(p[2]) <= marks["callback_wall"]]
        rec.set("trip", {
            "tripped": True, "threshold_fraction": config.threshold_fraction, "limit_bytes": event.limit_bytes,
            "used_at_trip_bytes": event.used_bytes, "total_bytes": total,
            "sample_to_kill_ms": (marks["killed"] - sample_at) * 1e3,
            "callback_to_kill_ms": (marks["killed"] - marks["callback"]) * 1e3,
            "kill_to_exit_ms": (exited - marks["killed"]) * 1e3,
            "kill_to_nvml_release_ms": (released_at - marks["killed"]) * 1e3 if released else None,
            "released": released, "group_gone": gone, "peak_bytes": summary.peak_bytes[0],
            "allocation_to_detection_ms": (marks["callback_wall"] - crossing[-1]) * 1e3 if crossing else None,
            "grow_steps_logged": len(grow_lines),
        })

        # 3b: a real torch.OutOfMemoryError, its log through our classifier.
        if time.time() > deadline - 15:
            rec.set("real_oom", {"skipped": "out of time"})
            return
        proc = EngineProcess([*child, "--mode", "oom"], env, home / "hog-oom.log", registry)
        sampler = Sampler(monitor, hz=200.0)
        sampler.start()
        proc.start()
        limit = min(deadline - 5, time.time() + 60)
        while proc.returncode is None and time.time() < limit:
            time.sleep(0.005)
        summary = sampler.stop()
        rc = proc.returncode
        proc.stop(grace_s=2)
        lines = (home / "hog-oom.log").read_text(errors="replace").splitlines()
        after_ready = classify(lines, ready=True)
        oom_lines = [line for line in lines if "out of memory" in line.lower()]
        wall = [line.split() for line in lines if line.startswith("wall ")]
        rec.set("real_oom", {
            "returncode": rc, "error_line": oom_lines[-1] if oom_lines else None,
            "classified_before_ready": proc.facts.failure, "classified_after_ready": after_ready.failure,
            "reason": after_ready.reason, "nvml_peak_bytes": summary.peak_bytes[0], "total_bytes": total,
            "nvml_peak_fraction": summary.peak_bytes[0] / total,
            "held_at_wall_bytes": int(wall[-1][1]) if wall else None, "log_tail": lines[-6:],
        })


def run_hog(config: CheckConfig, mode: str) -> int:
    """The child of step 3: `grow` allocates toward the total until killed; `oom` allocates until the
    device refuses, narrows the last chunk down to 2 MiB, then lets one OutOfMemoryError escape."""
    gpu = open_device(replace(config, gpu_index=0) if not config.dry_run else config)
    free, total = gpu.free_bytes()
    held = 0
    if mode == "grow":
        chunk = GIB
        while free - chunk > 0.02 * total:
            gpu.hold(chunk)
            held += chunk
            print(f"held {held} {time.time():.6f}", flush=True)
            free, _ = gpu.free_bytes()
            time.sleep(0.01)
        print(f"stopped growing at {held} bytes, {free} free: waiting to be killed", flush=True)
        time.sleep(120)
        return 3
    chunk = 4 * GIB
    while True:
        try:
            gpu.hold(chunk)
            held += chunk
            continue
        except DeviceOutOfMemoryError as exc:
            if chunk > 2 * MIB:
                chunk //= 2
                continue
            failed = exc
        break
    free, _ = gpu.free_bytes()
    print(f"wall {held} {free} {total}", flush=True)
    if isinstance(failed.__cause__, gpu.oom_error_type()):
        raise failed.__cause__ from None  # the framework's own exception, its traceback as a server logs it
    print(f"torch.OutOfMemoryError: {failed.message}", flush=True)  # the stand-in's line, as torch prints it
    return 1
