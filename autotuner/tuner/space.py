"""The search space: scenario parameters ↔ Optuna distributions ↔ vLLM flags, and the flag rules vLLM
would reject, checked before anything is launched."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
import psutil

from autotuner.errors import ScenarioError
from autotuner.scenario import FlagValue, Scenario, SearchParam

GIB = 1 << 30
# Pinned host RAM the offload range may use, as a share of the host's total (the rest keeps the OS,
# the API server and the tokenizer alive).
OFFLOAD_HOST_SHARE = 0.5
UTIL_LOW, UTIL_HIGH = 0.70, 0.97
UTIL_THRESHOLD_MARGIN = 0.02


def default_space(scenario: Scenario) -> dict[str, SearchParam]:
    """The token budget on a log scale, utilization in 0.01 steps, and cpu-offload up to what the
    host's RAM allows for this TP size.

    Utilization tops out at 0.97, and at least two points under a fractional OOM threshold: vLLM's
    steady footprint is utilization × total plus the CUDA context (0.3–0.5 GiB, outside the budget),
    so at threshold − 0.01 a trial trips the threshold before serving anything — a wasted GPU launch
    (benchmarks/sample_efficiency.py measured the waste)."""
    util_high = UTIL_HIGH
    if scenario.oom_threshold.fraction is not None:
        util_high = min(UTIL_HIGH, round(scenario.oom_threshold.fraction - UTIL_THRESHOLD_MARGIN, 2))
    return {
        "max-num-batched-tokens": SearchParam(type="int", low=256, high=16384, log=True),
        "gpu-memory-utilization": SearchParam(type="float", low=min(UTIL_LOW, util_high), high=util_high,
                                              step=0.01),
        "cpu-offload-gb": SearchParam(type="float", low=0.0, high="auto", step=0.5),
    }


def offload_limit_gib(scenario: Scenario, host_bytes: int | None = None) -> float:
    """GiB per GPU that can be offloaded with the host RAM available now: each of the TP workers pins
    about 1.9× the amount asked (vLLM #56410 measured 1.9×), within a share of what is available."""
    from autotuner.trust.offload import PINNED_HOST_PER_GIB

    host = host_bytes if host_bytes is not None else psutil.virtual_memory().available
    if scenario.engine.kind in ("sim", "sim-virtual"):
        host = host_bytes if host_bytes is not None else 256 * GIB  # the simulated box's host
    limit = host * OFFLOAD_HOST_SHARE / (PINNED_HOST_PER_GIB * scenario.tensor_parallel_size()) / GIB
    weights = _weights_per_gpu_gib(scenario)
    if weights is not None:  # offloading more than a GPU's share of the weights changes nothing
        limit = min(limit, weights)
    return max(0.0, math.floor(limit * 2) / 2)


def _weights_per_gpu_gib(scenario: Scenario) -> float | None:
    """From a preset or a local config.json; None for a hub name we cannot read offline."""
    from autotuner.errors import ModelSpecError
    from autotuner.sim.models import load_model

    try:
        model = load_model(scenario.engine.model)
    except ModelSpecError:
        return None
    return model.weight_bytes / scenario.tensor_parallel_size() / GIB


@dataclass(frozen=True)
class Space:
    params: dict[str, SearchParam]
    distributions: dict[str, optuna.distributions.BaseDistribution]

    def to_flags(self, params: Mapping[str, Any]) -> dict[str, FlagValue]:
        flags: dict[str, FlagValue] = {}
        for name, value in params.items():
            p = self.params.get(name)
            if p is not None and p.type == "int":
                flags[name] = int(value)
            elif p is not None and p.type == "float":
                flags[name] = round(float(value), 6)
            else:
                flags[name] = value
        return flags

    def clamp(self, flags: Mapping[str, FlagValue]) -> dict[str, Any]:
        """Params for `enqueue_trial` from flags: only the space's names, values clamped into range
        (Optuna would use an out-of-range value as it is) and typed like the distribution."""
        out: dict[str, Any] = {}
        for name, dist in self.distributions.items():
            if name not in flags:
                continue
            value = flags[name]
            if isinstance(dist, optuna.distributions.IntDistribution):
                out[name] = int(min(max(int(value), dist.low), dist.high))  # type: ignore[arg-type]
            elif isinstance(dist, optuna.distributions.FloatDistribution):
                v = min(max(float(value), dist.low), dist.high)  # type: ignore[arg-type]
                if dist.step:
                    v = dist.low + round((v - dist.low) / dist.step) * dist.step
                out[name] = round(v, 6)
            elif isinstance(dist, optuna.distributions.CategoricalDistribution) and value in dist.choices:
                out[name] = value
        return out


def build_space(scenario: Scenario, host_bytes: int | None = None) -> Space:
    params = scenario.search_space if scenario.search_space is not None else default_space(scenario)
    if not params:
        raise ScenarioError(f"{scenario.source or 'scenario'}: search_space is empty: name at least one vLLM "
                            "flag to tune (or leave search_space out for the defaults)")
    dists: dict[str, optuna.distributions.BaseDistribution] = {}
    resolved: dict[str, SearchParam] = {}
    for raw_name, p in params.items():
        name = raw_name.removeprefix("--").replace("_", "-")
        if name in scenario.engine.flags:
            raise ScenarioError(f"{scenario.source or 'scenario'}: search_space.{raw_name} is also fixed in "
                                "engine.flags; a flag is either fixed or searched")
        high = p.high
        if high == "auto":
            if name != "cpu-offload-gb":
                raise ScenarioError(f"search_space.{raw_name}.high: 'auto' is only known for cpu-offload-gb")
            high = offload_limit_gib(scenario, host_bytes)
        if p.type == "int":
            assert p.low is not None and high is not None
            dists[name] = optuna.distributions.IntDistribution(
                int(p.low), int(high), log=p.log, step=int(p.step or 1))
        elif p.type == "float":
            assert p.low is not None and high is not None
            low, hi = float(p.low), float(high)
            if p.step:
                hi = low + math.floor((hi - low) / p.step + 1e-9) * p.step
            if hi <= low:
                dists[name] = optuna.distributions.CategoricalDistribution([low])
            else:
                dists[name] = optuna.distributions.FloatDistribution(low, round(hi, 6), log=p.log, step=p.step)
        elif p.type == "bool":
            dists[name] = optuna.distributions.CategoricalDistribution([True, False])
        else:
            dists[name] = optuna.distributions.CategoricalDistribution(list(p.choices or []))  # type: ignore[arg-type]
        resolved[name] = p
    return Space(resolved, dists)


# vLLM 0.32 defaults the rules need when a flag is not given (facts note §2).
def _budget(flags: Mapping[str, FlagValue], chunked: bool, max_model_len: int | None) -> int | None:
    value = flags.get("max-num-batched-tokens")
    if value is not None:
        return int(value)  # type: ignore[arg-type]
    if not chunked and max_model_len is not None:
        return max(max_model_len, 2048)
    return None


def flag_violation(flags: Mapping[str, FlagValue]) -> str | None:
    """The rules vLLM enforces at startup that we can check without launching (same wording)."""
    chunked = flags.get("enable-chunked-prefill", True) is not False
    max_len = flags.get("max-model-len")
    max_model_len = int(max_len) if isinstance(max_len, int | float | str) and str(max_len).isdigit() else None
    budget = _budget(flags, chunked, max_model_len)
    seqs = flags.get("max-num-seqs")
    if budget is not None and seqs is not None and budget < int(seqs):  # type: ignore[arg-type]
        return f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs})."
    if not chunked and budget is not None and max_model_len is not None and budget < max_model_len:
        return (f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). This "
                "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
                "reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    util = flags.get("gpu-memory-utilization")
    if util is not None and not 0 < float(util) <= 1:  # type: ignore[arg-type]
        return f"gpu_memory_utilization: Input should be greater than 0 and at most 1, got {util}"
    offload = flags.get("cpu-offload-gb")
    if offload is not None and float(offload) < 0:  # type: ignore[arg-type]
        return f"cpu_offload_gb: Input should be greater than or equal to 0, got {offload}"
    return None
