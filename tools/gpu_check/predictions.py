"""The simulator's predictions for the same model, GPU (its total set to the measured one),
utilization, budgets and prompts; each part guarded, so one failing part leaves the rest.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from tools.gpu_check.config import GIB, MIB, CheckConfig


def sim_gpu(config: CheckConfig, total_bytes: int | None) -> Any:
    from autotuner.catalog.gpus import GIB as SIM_GIB
    from autotuner.catalog.gpus import load_gpu

    gpu = load_gpu(config.gpu_spec)
    return replace(gpu, memory_gib=total_bytes / SIM_GIB) if total_bytes else gpu


def sim_config(config: CheckConfig, budget: int, total_bytes: int | None) -> Any:
    from autotuner.sim.args import build_config, parse_args

    max_len = max(8192, max(config.prompts) + 16)
    argv = [config.model, "--gpu-memory-utilization", str(config.utilization), "--max-num-batched-tokens",
            str(budget), "--max-model-len", str(max_len), "--no-enable-prefix-caching", "--sim-gpu", config.gpu_spec,
            "--max-num-seqs", str(min(256, budget))]
    engine = build_config(parse_args(argv), env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    return replace(engine, sim=replace(engine.sim, gpu=sim_gpu(config, total_bytes)))


def sim_predictions(config: CheckConfig, total_bytes: int | None) -> dict[str, Any]:
    """What autotuner.sim says for the same model, GPU, utilization, budgets and prompts. Each
    part is guarded: the simulator's memory model changes, and one failing part must not hide the rest."""
    out: dict[str, Any] = {"errors": []}

    def guarded(key: str, fn: Callable[[], Any]) -> None:
        try:
            out[key] = fn()
        except Exception as exc:
            out["errors"].append(f"{key}: {type(exc).__name__}: {exc}")

    def startup() -> dict[str, Any]:
        from autotuner.sim import memory
        from autotuner.sim.memory import plan_startup

        plan = plan_startup(sim_config(config, max(config.budgets), total_bytes))
        return {"context_bytes": getattr(memory, "CUDA_CONTEXT_BYTES", None), "weights_bytes": plan.weights_bytes,
                "profile_peak_bytes": plan.activation_peak_bytes,
                "non_torch_bytes": plan.non_torch_bytes, "kv_bytes": plan.kv_cache_bytes,
                "kv_tokens": plan.kv_cache_tokens, "steady_bytes": plan.steady_bytes,
                "requested_bytes": plan.requested_bytes}

    def transients() -> dict[str, Any]:
        from autotuner.sim.evaluate import EvalRequest, evaluate
        from autotuner.sim.memory import plan_startup

        rng = random.Random(config.seed)
        per_budget: dict[str, Any] = {}
        for budget in config.budgets:
            engine = sim_config(config, budget, total_bytes)
            vocab = engine.model.vocab_size
            requests = [EvalRequest([rng.randrange(vocab) for _ in range(n)], 1, True, 0.0) for n in config.prompts]
            ev = evaluate(engine, requests, None)
            if ev.outcome == "startup-failed":
                per_budget[str(budget)] = {"outcome": ev.outcome, "reason": ev.reason}
                continue
            steady = plan_startup(engine).steady_bytes
            peak = ev.memory.get("peak_bytes", [steady])
            per_budget[str(budget)] = {"outcome": ev.outcome, "transient_bytes": max(peak) - steady,
                                       "reason": ev.reason}
        return per_budget

    def oom_text() -> dict[str, Any]:
        from autotuner.engine.classify import classify
        from autotuner.sim.memory import oom_message

        total = total_bytes or sim_gpu(config, None).memory_bytes
        message = oom_message(2 * MIB, total, total - MIB, total - 2 * GIB)
        return {"message": message, "classified_after_ready": classify([message], ready=True).failure}

    def constants() -> dict[str, Any]:
        from autotuner.monitor.sampler import DEFAULT_FRACTION
        from autotuner.sim.gpu_state import RELEASE_DELAY_S

        return {"release_delay_s": RELEASE_DELAY_S, "threshold_default_fraction": DEFAULT_FRACTION}

    guarded("gpu", lambda: asdict(sim_gpu(config, total_bytes)))
    guarded("startup", startup)
    guarded("transient", transients)
    guarded("oom", oom_text)
    guarded("constants", constants)
    return out
