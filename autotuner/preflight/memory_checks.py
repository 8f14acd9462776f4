"""Can the scenario's tensor-parallel size hold the model: each GPU's share of the weights, the
profiled step and the KV cache of one max-model-len request within utilization × its memory
(vLLM's own startup check, autotuner.vllm.rules `check_kv_cache`), at the most generous candidate
the study would try. A TP that fails here fails every trial with a startup error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.errors import ModelSpecError, UserInputError
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import FlagValue, Platform, VllmRuleError
from autotuner.vllm import defaults as vllm_defaults
from autotuner.vllm.rules import GIB, CardMemory, check_kv_cache

NAME = "model fits"


@dataclass(frozen=True)
class _Best:
    """The candidate that leaves the most room for the KV cache."""

    utilization: float
    budget: int
    offload_gib: float
    max_num_seqs: int


def check_model_fits(scenario: Scenario, flags: Mapping[str, FlagValue], platform: Platform | None,
                     max_model_len: int | None) -> Check:
    """`flags`: the fixed flags typed; `max_model_len`: what vLLM will serve (the flag or the model's)."""
    from autotuner.catalog.models import load_model

    if platform is None or platform.is_cpu or platform.memory_gib <= 0:
        return Check(NAME, "ok", "unchecked: no GPU seen")
    try:
        spec = load_model(scenario.engine.model)
    except ModelSpecError:
        return Check(NAME, "ok", "unchecked: the model's shape is not readable offline (a hub name)")
    if max_model_len is None:
        return Check(NAME, "ok", "unchecked: the context length is vLLM's to derive")
    best = _best(scenario, flags, platform)
    if best is None:
        return Check(NAME, "ok", "unchecked: the search space did not build (see flags)")
    tp = scenario.tensor_parallel_size()
    total = int(platform.memory_gib * GIB)
    block = int(flags.get("block-size") or vllm_defaults.BLOCK_SIZE)  # type: ignore[arg-type]
    where = f"tensor-parallel-size {tp}" + (" (the default: engine.flags does not set it)"
                                             if "tensor-parallel-size" not in flags else "")
    try:
        available = check_kv_cache(_card(spec, tp, total, best, 0.0), best.utilization, max_model_len, block)
    except VllmRuleError as exc:
        without = exc.reason
    else:
        return Check(NAME, "ok", f"{where}: {spec.weight_bytes / tp / GIB:.1f} GiB of weights per GPU, "
                     f"{available / GIB:.1f} GiB left for the KV cache at utilization {best.utilization:g} "
                     f"(one {max_model_len}-token request needs "
                     f"{spec.kv_bytes_per_token(tp) * max_model_len / GIB:.2f} GiB)")
    fix = _fix(spec, tp, total, best, max_model_len, block, platform, flags)
    if best.offload_gib > 0:
        try:
            check_kv_cache(_card(spec, tp, total, best, best.offload_gib), best.utilization, max_model_len, block)
        except VllmRuleError:
            pass
        else:
            return Check(NAME, "warning", f"{where}: only candidates that offload weights to host RAM can start "
                         f"(up to {best.offload_gib:g} GiB per GPU is searched); without offload vLLM refuses: "
                         f"{without}", fix + ", or accept offloaded (slower) candidates")
    return Check(NAME, "failed", f"{where} on {platform.count or '?'} × {platform.name} ({platform.memory_gib:.1f} "
                 f"GiB): {spec.weight_bytes / tp / GIB:.1f} GiB of weights per GPU, and even the most generous "
                 f"candidate (utilization {best.utilization:g}, max-num-batched-tokens {best.budget}"
                 + (f", cpu-offload-gb {best.offload_gib:g}" if best.offload_gib else "")
                 + f") would be refused by vLLM: {without}", fix)


def _card(spec: Any, tp: int, total: int, best: _Best, offload_gib: float) -> CardMemory:
    from autotuner.tuner.scenario_memory import SAMPLER_BYTES_PER_LOGIT, STARTUP_OVERHEAD_BYTES, activation_per_token

    weights = max(0, spec.weight_bytes // tp - int(offload_gib * GIB))
    sampler = min(best.budget, best.max_num_seqs) * spec.vocab_size * SAMPLER_BYTES_PER_LOGIT
    rest = STARTUP_OVERHEAD_BYTES + int(best.budget * activation_per_token(spec, tp)) + sampler
    return CardMemory(total, weights, rest, spec.kv_bytes_per_token(tp))


def _fix(spec: Any, tp: int, total: int, best: _Best, max_model_len: int, block: int, platform: Platform,
         flags: Mapping[str, FlagValue]) -> str:
    """The smallest TP that holds the model on this box, else the context that fits."""
    pp = int(flags.get("pipeline-parallel-size") or 1)  # type: ignore[arg-type]
    gpus = platform.count or tp
    for candidate in range(tp + 1, gpus // pp + 1):
        if spec.num_heads % candidate:
            continue
        try:
            check_kv_cache(_card(spec, candidate, total, best, 0.0), best.utilization, max_model_len, block)
        except VllmRuleError:
            continue
        return (f"set engine.flags.tensor-parallel-size: {candidate} (the smallest that holds the model on "
                f"this box's {gpus} GPUs; production's own TP if it differs)")
    kv = spec.kv_bytes_per_token(tp)
    card = _card(spec, tp, total, best, 0.0)
    room = int(total * best.utilization) - card.weights - card.rest
    fitting = max(0, room // kv // block * block) if kv else 0
    if fitting >= block:
        return (f"lower engine.flags.max-model-len to at most {fitting}, or use GPUs with more memory: no "
                f"tensor-parallel size up to {gpus // pp} holds a {max_model_len}-token context here")
    return f"use more or larger GPUs, or a smaller (quantized) model: no tensor-parallel size up to {gpus // pp} fits"


def _best(scenario: Scenario, flags: Mapping[str, FlagValue], platform: Platform) -> _Best | None:
    """The highest utilization, smallest token budget and largest offload the study would try."""
    import optuna

    from autotuner.trials.offload_axis import FREED
    from autotuner.tuner.space import build_space

    try:
        space = build_space(scenario) if scenario.search_space != {} else None
    except UserInputError:
        return None
    dists: dict[str, Any] = dict(space.distributions) if space is not None else {}

    def extreme(name: str, fixed_default: float, highest: bool) -> float:
        if name in flags and isinstance(flags[name], int | float) and not isinstance(flags[name], bool):
            return float(flags[name])  # type: ignore[arg-type]
        dist = dists.get(name)
        if isinstance(dist, optuna.distributions.IntDistribution | optuna.distributions.FloatDistribution):
            return float(dist.high if highest else dist.low)
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            numbers = [float(c) for c in dist.choices if isinstance(c, int | float) and not isinstance(c, bool)]
            if numbers:
                return max(numbers) if highest else min(numbers)
        return fixed_default

    budget_default, seqs_default = vllm_defaults.scheduler_defaults(platform, scenario.tensor_parallel_size())
    seqs = int(extreme("max-num-seqs", seqs_default, highest=False))
    offload = max(extreme("cpu-offload-gb", vllm_defaults.CPU_OFFLOAD_GB, highest=True),
                  extreme(FREED, 0.0, highest=True))
    return _Best(extreme("gpu-memory-utilization", vllm_defaults.GPU_MEMORY_UTILIZATION, highest=True),
                 int(extreme("max-num-batched-tokens", budget_default, highest=False)), offload, seqs)
