"""Step 2, ``wall``: the memory wall of chunked prefill: vLLM V1's startup (weights, profiled
activations, KV cache), then each token budget per SDPA backend, the rise of torch's and NVML's memory.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tools.gpu_check.config import CheckConfig
from tools.gpu_check.device import DeviceOutOfMemoryError
from tools.gpu_check.gpu_access import attempt, open_device, open_nvml, settled_sample, wait_idle
from tools.gpu_check.prefill import schedule_chunks
from tools.gpu_check.records import Recorder


def step_wall(config: CheckConfig, rec: Recorder, deadline: float) -> None:
    from autotuner.catalog.models import load_model
    from autotuner.monitor import Sampler

    spec = load_model(config.model)
    monitor = open_nvml(config)
    with monitor:
        total = monitor.devices()[0].total_bytes
        wait_idle(monitor, rec)
        before_nvml = monitor.sample()[0]
        gpu = open_device(config)
        rec.set("versions", gpu.versions())
        with_context = monitor.sample()[0]
        rec.set("context_bytes", with_context - before_nvml - gpu.memory()[1])
        t = time.perf_counter()
        weights = gpu.load_model(spec, config.layers)
        rec.set("model", {"preset": config.model, "layers": config.layers or spec.num_layers,
                          "prompts": list(config.prompts),
                          "weights_bytes": weights, "build_s": time.perf_counter() - t})
        rec.set("attention_rel_error_flash_math_vs_fp64", attempt(gpu.attention_agreement))
        # vLLM V1's startup: profile one forward of the largest budget, no KV cache yet.
        profile_tokens = max(config.budgets)
        allocated0, _ = gpu.memory()
        gpu.reset_peak()
        t = time.perf_counter()
        try:
            gpu.run([[(0, 0, profile_tokens)]], "flash", use_kv=False)
        except DeviceOutOfMemoryError as exc:
            rec.set("profile_oom", exc.message)
            raise
        profile_peak = gpu.peak()[0] - allocated0
        gpu.empty_cache()
        _, reserved = gpu.memory()
        used = monitor.sample()[0]
        non_torch = max(0, used - with_context - reserved)
        requested = math.ceil(config.utilization * total)
        kv_bytes = requested - weights - profile_peak - non_torch
        rec.set("startup", {"total_bytes": total, "utilization": config.utilization, "requested_bytes": requested,
                            "profile_tokens": profile_tokens, "profile_peak_bytes": profile_peak,
                            "profile_s": time.perf_counter() - t, "non_torch_bytes": non_torch,
                            "kv_bytes_planned": kv_bytes, "nvml_before_bytes": before_nvml})
        kv_tokens = gpu.reserve_kv(kv_bytes)
        gpu.empty_cache()
        steady = monitor.sample()[0]
        rec.set("steady", {"kv_tokens": kv_tokens, "nvml_used_bytes": steady, "free_bytes": total - steady,
                           "torch_allocated_bytes": gpu.memory()[0]})
        if kv_tokens < sum(config.prompts):
            raise RuntimeError(f"the KV cache holds {kv_tokens} tokens, fewer than the prompts' {sum(config.prompts)}")

        last_s = 0.0
        for backend in config.backends:
            # Warm-up: the first use of a kernel loads its module, memory NVML sees and torch does not;
            # loaded here, it stays out of the first budget's rise (and is a figure of its own).
            gpu.empty_cache()
            nvml0 = monitor.sample()[0]
            row0: dict[str, Any] = {"backend": backend}
            try:
                gpu.run(schedule_chunks((min(config.prompts), min(config.prompts)), min(config.budgets)), backend)
            except Exception as exc:
                row0["error"] = f"{type(exc).__name__}: {exc}"[:500]
            gpu.empty_cache()
            row0["nvml_rise_after_bytes"] = monitor.sample()[0] - nvml0
            rec.add("warmup", row0)
            for budget in config.budgets:
                # A run may take about as long as the last one did at a smaller budget, or longer.
                if time.time() + 2 * last_s + 2 > deadline:
                    rec.add("wall", {"backend": backend, "budget": budget, "skipped": "out of time"})
                    continue
                steps = schedule_chunks(config.prompts, budget)
                gpu.empty_cache()
                alloc0, res0 = gpu.memory()
                nvml0 = settled_sample(monitor)
                gpu.reset_peak()
                sampler = Sampler(monitor, hz=200.0)
                sampler.start()
                t = time.perf_counter()
                row: dict[str, Any] = {"backend": backend, "budget": budget, "engine_steps": len(steps)}
                try:
                    gpu.run(steps, backend)
                except DeviceOutOfMemoryError as exc:
                    row["oom"] = exc.message.splitlines()[0]
                except Exception as exc:  # no kernel for this backend, say: the other runs still count
                    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                row["seconds"] = last_s = time.perf_counter() - t
                nvml_after = monitor.sample()[0]
                summary = sampler.stop()
                max_alloc, max_res = gpu.peak()
                row.update(
                    max_allocated_bytes=max_alloc, max_reserved_bytes=max_res,
                    allocated_rise_bytes=max_alloc - alloc0, reserved_rise_bytes=max_res - res0,
                    nvml_rise_bytes=max(summary.peak_bytes[0], nvml_after) - nvml0, nvml_steady_bytes=nvml0,
                    nvml_samples=summary.samples,
                )
                rec.add("wall", row)
                gpu.empty_cache()
