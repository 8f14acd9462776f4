"""The search space: scenario parameters ↔ Optuna distributions ↔ vLLM flags, and the flag rules vLLM
would reject (from autotuner.vllm), checked before anything is launched."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import psutil
import structlog

from autotuner.backends import backend_for
from autotuner.errors import ScenarioError, UserInputError
from autotuner.scenario import Scenario, SearchParam
from autotuner.trials import offload_axis
from autotuner.tuner.host_ram import PINNED_HOST_PER_GIB
from autotuner.vllm import FlagValue, ModelLimits, Platform, flag_name, knowledge_for
from autotuner.vllm.flags import UTILIZATION

log = structlog.get_logger(__name__)

GIB = 1 << 30
# Pinned host RAM the offload range may use, as a share of the host's total (the rest keeps the OS,
# the API server and the tokenizer alive).
OFFLOAD_HOST_SHARE = 0.5
UTIL_LOW, UTIL_HIGH = 0.70, 0.97
UTIL_THRESHOLD_MARGIN = 0.02
# HostMonitor's device names: a study of an engine on the CPU backend.
_HOST_DEVICES = ("engine process tree RSS", "host RAM used")


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
    host = host_bytes if host_bytes is not None else psutil.virtual_memory().available
    simulated_host = backend_for(scenario).simulated_host_bytes
    if simulated_host is not None:
        host = host_bytes if host_bytes is not None else simulated_host  # the simulated box's host
    limit = host * OFFLOAD_HOST_SHARE / (PINNED_HOST_PER_GIB * scenario.tensor_parallel_size()) / GIB
    weights = _weights_per_gpu_gib(scenario)
    if weights is not None:  # offloading more than a GPU's share of the weights changes nothing
        limit = min(limit, weights)
    return max(0.0, math.floor(limit * 2) / 2)


def _weights_per_gpu_gib(scenario: Scenario) -> float | None:
    """From a preset or a local config.json; None for a hub name we cannot read offline."""
    from autotuner.catalog.models import weights_per_gpu_gib

    return weights_per_gpu_gib(scenario.engine.model, scenario.tensor_parallel_size())


def offload_shape(scenario: Scenario) -> offload_axis.LayerShape | None:
    """The model's layers per GPU, for the offload axis's prefetch plans; None for a hub name offline."""
    return offload_axis.per_gpu(offload_axis.layer_shape(scenario.engine.model), scenario.tensor_parallel_size())


@dataclass(frozen=True)
class Space:
    params: dict[str, SearchParam]
    distributions: dict[str, optuna.distributions.BaseDistribution]
    offload_shape: offload_axis.LayerShape | None = None  # set when the space searches the offload axis

    def to_flags(self, params: Mapping[str, Any]) -> dict[str, FlagValue]:
        flags: dict[str, FlagValue] = {}
        if offload_axis.MODE in self.distributions:
            params = dict(params)
            mode = str(params.pop(offload_axis.MODE, "none"))
            freed = float(params.pop(offload_axis.FREED, 0.0) or 0.0)
            flags.update(offload_axis.to_flags(mode, freed, self.offload_shape))
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
        if offload_axis.MODE in self.distributions:
            mode, freed = offload_axis.from_flags(flags, self.offload_shape)
            flags = {**flags, offload_axis.MODE: mode, offload_axis.FREED: freed}
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
        name = flag_name(raw_name)
        if name in scenario.engine.flags:
            raise ScenarioError(f"{scenario.source or 'scenario'}: search_space.{raw_name} is also fixed in "
                                "engine.flags; a flag is either fixed or searched")
        high = p.high
        if high == "auto":
            if name not in ("cpu-offload-gb", offload_axis.FREED):
                raise ScenarioError(f"search_space.{raw_name}.high: 'auto' is only known for cpu-offload-gb and "
                                    f"{offload_axis.FREED}")
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
    return Space(resolved, dists, _offload_axis(scenario, dists))


def _offload_axis(scenario: Scenario, dists: Mapping[str, optuna.distributions.BaseDistribution]
                  ) -> offload_axis.LayerShape | None:
    """Check the offload axis (`offload-mode` with `offload-gib`, instead of the raw offload flags) and
    return the layer shape its prefetch plans need."""
    where = scenario.source or "scenario"
    mode = dists.get(offload_axis.MODE)
    if mode is None:
        if offload_axis.FREED in dists:
            raise ScenarioError(f"{where}: search_space.{offload_axis.FREED} needs search_space.{offload_axis.MODE} "
                                f"(categorical, choices from {', '.join(offload_axis.MODES)})")
        return None
    if not isinstance(mode, optuna.distributions.CategoricalDistribution) or not mode.choices or \
            any(c not in offload_axis.MODES for c in mode.choices):
        raise ScenarioError(f"{where}: search_space.{offload_axis.MODE} must be categorical with choices from "
                            f"{', '.join(offload_axis.MODES)}")
    if offload_axis.FREED not in dists:
        raise ScenarioError(f"{where}: search_space.{offload_axis.MODE} needs search_space.{offload_axis.FREED} "
                            "(float, GiB freed per GPU, e.g. low 0.5, high auto, step 0.5)")
    offload_flags = (offload_axis.UVA_FLAG, offload_axis.BACKEND_FLAG, offload_axis.GROUP_FLAG,
                     offload_axis.IN_GROUP_FLAG, offload_axis.STEP_FLAG)
    clash = [f for f in offload_flags if f in dists or f in scenario.engine.flags]
    if clash:
        raise ScenarioError(f"{where}: search_space.{offload_axis.MODE} sets the offload flags itself; leave out "
                            f"--{', --'.join(clash)} from search_space and engine.flags")
    shape = offload_shape(scenario)
    if "prefetch" in mode.choices and shape is None:
        raise ScenarioError(f"{where}: search_space.{offload_axis.MODE}: prefetch needs the model's layers, which "
                            f"{scenario.engine.model!r} does not give offline; use a local directory with "
                            "config.json, or leave prefetch out of the choices")
    return shape


class FlagRules:
    """vLLM's startup rules and defaults (autotuner.vllm, for the engine's version) on the platform the
    study runs on: what `vllm serve` would refuse, checked before a launch."""

    def __init__(self, scenario: Scenario, inventory: Sequence[str], engine_version: str | None) -> None:
        self.vllm = knowledge_for(engine_version)
        self.platform = platform_of(inventory)
        self.model = model_limits(scenario)
        self.env = {**os.environ, **scenario.engine.env}
        self.world_size = scenario.tensor_parallel_size()

    def violation(self, flags: Mapping[str, FlagValue]) -> str | None:
        try:
            typed = self.vllm.coerce_all(flags, "flags")  # YAML may hold "8k" or "2048"
        except UserInputError as exc:
            return str(exc)
        return self.vllm.violation(typed, self.platform, self.model, self.env)

    def defaults(self) -> dict[str, FlagValue]:
        """The baseline: vLLM's own values for the searched flags on this platform (a 24 GiB card's
        when the platform is unknown)."""
        return self.vllm.default_flags(self.platform or Platform("unknown", 24.0), self.world_size)


def platform_of(inventory: Sequence[str]) -> Platform | None:
    """From a study key's GPU inventory (`NVIDIA GeForce RTX 3090 (23.69 GiB)` once per GPU); the CPU
    backend when the monitor watched host memory."""
    if not inventory:
        return None
    name, _, rest = inventory[0].partition(" (")
    if name in _HOST_DEVICES:
        return Platform("cpu", 0.0, None)
    try:
        gib = float(rest.split(" ")[0])
    except ValueError:
        return None
    return Platform(name, gib, len(inventory))


def model_limits(scenario: Scenario) -> ModelLimits | None:
    """The model's heads and context from a simulator preset or a local config.json; None for a hub
    name (its rules are then vLLM's to check)."""
    from autotuner.catalog.models import load_model
    from autotuner.errors import ModelSpecError

    model = scenario.engine.model
    simulated = backend_for(scenario).simulated
    if not simulated and not Path(model).is_dir():
        return None
    try:
        spec = load_model(model)
    except ModelSpecError:
        return None
    if not simulated:
        # vLLM derives the context from more than config.json (tokenizer limits, rope variants): judge
        # only what config.json says for certain.
        return ModelLimits(spec.num_heads, None, None)
    return ModelLimits(spec.num_heads, spec.max_position_embeddings, spec.derived_max_model_len)


# vLLM's startup needs utilization × total ≤ the memory free at its snapshot, which already carries the
# CUDA context and NCCL buffers (~0.3-0.5 GiB, facts note §1) besides other processes' memory.
CUDA_CONTEXT_MARGIN_BYTES = 512 << 20


def fit_utilization_to_free(space: Space, headroom: tuple[int, int] | None) -> Space:
    """Lower the utilization bound to what other processes' memory leaves on the engine's GPUs:
    `headroom` is (total bytes, the largest foreign baseline among them); a higher value cannot start."""
    dist = space.distributions.get(UTILIZATION)
    if headroom is None or not isinstance(dist, optuna.distributions.FloatDistribution) or headroom[0] <= 0:
        return space
    total_bytes, foreign_bytes = headroom
    step = dist.step or 0.01
    fits = (total_bytes - foreign_bytes - CUDA_CONTEXT_MARGIN_BYTES) / total_bytes
    high = round(math.floor(fits / step + 1e-9) * step, 6)
    if high >= dist.high:
        return space
    low = float(dist.low)
    if high <= low:
        # One value left; still a float distribution, so a resumed study keeps a compatible parameter.
        high = low = max(high, step)
    elif dist.step:
        high = round(low + math.floor((high - low) / dist.step + 1e-9) * dist.step, 6)
    log.warning("space.utilization_clamped", high=high, was=dist.high, foreign_mib=foreign_bytes >> 20,
                reason="vLLM starts only if utilization × total fits in the memory free at launch")
    new = optuna.distributions.FloatDistribution(low, high, log=dist.log, step=dist.step)
    return Space(space.params, {**space.distributions, UTILIZATION: new})
