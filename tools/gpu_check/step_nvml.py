"""Step 1, ``nvml``: our NVML monitor on the real driver: device, memory, processes while the step
holds 1 GiB, the Sampler's achieved rate and CPU cost, the latency of one memory query.
"""

from __future__ import annotations

import contextlib
import os
import time

from tools.gpu_check.config import GIB, CheckConfig
from tools.gpu_check.gpu_access import attempt, nvml_module, open_device, open_nvml
from tools.gpu_check.records import Recorder


def step_nvml(config: CheckConfig, rec: Recorder) -> None:
    import psutil

    from autotuner.monitor import Sampler

    monitor = open_nvml(config)
    with monitor:
        device = monitor.devices()[0]
        rec.set("device", {"index": device.index, "name": device.name, "uuid": device.uuid,
                           "total_bytes": device.total_bytes})
        with contextlib.suppress(Exception):
            module = nvml_module(config)
            driver = module.nvmlSystemGetDriverVersion()
            rec.set("driver", driver.decode() if isinstance(driver, bytes) else str(driver))
        rec.set("idle_used_bytes", monitor.sample()[0])
        rec.set("idle_processes", attempt(lambda: monitor.processes(0)))

        # Query latency: one memory reading, many times.
        lat = []
        for _ in range(2000):
            t = time.perf_counter_ns()
            monitor.sample()
            lat.append(time.perf_counter_ns() - t)
        lat.sort()
        rec.set("query_latency_us", {"median": lat[len(lat) // 2] / 1e3, "p99": lat[int(len(lat) * 0.99)] / 1e3,
                                     "max": lat[-1] / 1e3, "n": len(lat)})

        me = psutil.Process()
        for hz in (100.0, 200.0):
            sampler = Sampler(monitor, hz=hz)
            cpu0, t0 = me.cpu_times(), time.perf_counter()
            sampler.start()
            time.sleep(config.sampler_seconds)
            summary = sampler.stop()
            cpu1, wall = me.cpu_times(), time.perf_counter() - t0
            cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            rec.add("sampler", {"hz": hz, "achieved_hz": summary.sample_hz, "samples": summary.samples,
                                "cpu_fraction_of_core": cpu / wall, "errors": summary.sample_errors})

        # Our own allocation as NVML sees it: the process list, and used memory, while we hold 1 GiB.
        gpu = open_device(config)
        before = monitor.sample()[0]
        gpu.hold(GIB)
        time.sleep(0.2)
        held = monitor.sample()[0]
        procs = attempt(lambda: monitor.processes(0))
        listed = any(p == os.getpid() for p, _ in procs) if isinstance(procs, list) else None
        rec.set("hold_1gib", {"used_rise_bytes": held - before, "processes": procs, "own_pid": os.getpid(),
                              "own_pid_listed": listed})
        gpu.release_all()
