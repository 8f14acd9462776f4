"""The rules `vllm serve` 0.32 enforces at startup, before loading any weight, in its own words.

One function, `resolve`, used by the simulator (which prints the violation the way vLLM does and
exits 1) and by the tuner (which records the candidate as `invalid-flags` without a launch). What a
rule needs and is not known (the platform of a box we have not seen, the shape of a hub model we
cannot read) leaves that rule unchecked: the engine is the judge then.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotuner.errors import AutotunerError
from autotuner.vllm import defaults
from autotuner.vllm.defaults import Platform, scheduler_defaults
from autotuner.vllm.flags import FlagValue

LONG_MAX_MODEL_LEN_VAR = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
GIB = 1 << 30
_CONSERVING_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
# vllm/config/model_arch_convertor.py `derive_max_model_len_and_key`: the smallest of these keys wins.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# Rope types whose factor vLLM does not apply to the derived length (vllm/config/model.py).
_UNSCALED_ROPE = ("su", "longrope", "llama3")

ErrorKind = Literal["field", "value", "plain"]


@dataclass(frozen=True)
class ModelLimits:
    """What the rules need of the model's config.json."""

    num_heads: int
    max_position_embeddings: int | None = None  # None: not known for certain (vLLM derives it)
    derived_max_model_len: int | None = None
    max_len_key: str = "max_position_embeddings"  # the config.json key the derived length came from


def allows_long_max_model_len(env: Mapping[str, str]) -> bool:
    """vllm/envs.py: `VLLM_ALLOW_LONG_MAX_MODEL_LEN` is on when it reads 1 or true (any case)."""
    return env.get(LONG_MAX_MODEL_LEN_VAR, "0").strip().lower() in ("1", "true")


def derived_max_model_len(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """The context vLLM derives from a Hugging Face config.json (vllm/config/model.py
    `_get_and_verify_max_len`), and the key it names in its error; None when no key is there (vLLM
    then takes the user's max-model-len as it is). The tokenizer's model_max_length, which vLLM also
    reads, only ever lowers this: a length above what is returned here is refused for certain."""
    text = config.get("text_config")
    data: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    derived: float = math.inf
    key: str | None = None
    for name in _MAX_LEN_KEYS:
        value = data.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < derived:
            derived, key = value, name
    model_max = data.get("model_max_length")  # Command-R / Cohere: this key overrides the others
    if isinstance(model_max, int | float) and not isinstance(model_max, bool) and model_max:
        derived, key = model_max, "model_max_length"
    if key is None:
        return None
    rope = data.get("rope_parameters") or data.get("rope_scaling")
    ropes = list(rope.values()) if isinstance(rope, Mapping) and all(
        isinstance(v, Mapping) for v in rope.values()) and rope else [rope]
    if "gemma3" not in str(data.get("model_type", "")):  # Gemma 3's length is already scaled
        factor = 1.0
        for rp in ropes:
            if not isinstance(rp, Mapping):
                continue
            kind = rp.get("rope_type", rp.get("type"))
            if kind in _UNSCALED_ROPE:
                continue
            raw = rp.get("factor", factor)
            factor = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else factor
            original = rp.get("original_max_position_embeddings", data.get("original_max_position_embeddings"))
            if kind == "yarn" and isinstance(original, int) and not isinstance(original, bool):
                derived = original
        derived *= factor
    return int(derived), key


class VllmRuleError(AutotunerError):
    """A configuration vLLM refuses at startup (exit code 1 there).

    kind `field`: pydantic's error on one field of `config_class` (`text` is pydantic's message);
    kind `value`: a model validator's `Value error, ...`; kind `plain`: a bare `ValueError: ...`."""

    def __init__(self, kind: ErrorKind, text: str, config_class: str = "", field_name: str = "",
                 error_type: str = "value_error", value: object = None, flags: tuple[str, ...] = ()) -> None:
        super().__init__(text)
        self.flags = flags  # the flags (vLLM's long names) whose values break the rule
        self.kind = kind
        self.text = text
        self.config_class = config_class
        self.field_name = field_name
        self.error_type = error_type
        self.value = value

    @property
    def reason(self) -> str:
        """One line, as the log classifier reads it from vLLM's output."""
        return f"{self.field_name}: {self.text}" if self.kind == "field" else self.text

    def vllm_message(self) -> str:
        """What vLLM prints before it exits 1."""
        if self.kind == "plain":
            return f"ValueError: {self.text}"
        head = f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {self.config_class}\n"
        if self.kind == "value":
            return f"{head}  Value error, {self.text} [type=value_error]"
        value = self.value
        return (f"{head}{self.field_name}\n  {self.text} [type={self.error_type}, input_value={value!r}, "
                f"input_type={type(value).__name__}]")


@dataclass(frozen=True)
class ServeConfig:
    """The scheduler and cache settings vLLM would run with; None where the platform is unknown."""

    tensor_parallel_size: int
    max_model_len: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    gpu_memory_utilization: float
    cpu_offload_gb: float
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    block_size: int
    offload_backend: str = "none"  # the backend that runs: none | uva | prefetch (after `auto`)
    offload_group_size: int = 0
    offload_num_in_group: int = 1
    offload_prefetch_step: int = 1


def _field(config_class: str, field_name: str, text: str, error_type: str, value: object) -> VllmRuleError:
    return VllmRuleError("field", text, config_class, field_name, error_type, value,
                         flags=(field_name.replace("_", "-"),))


def _int(flags: Mapping[str, FlagValue], name: str) -> int | None:
    """An integer flag; None when unset or `auto` (-1): vLLM's own value then."""
    value = flags.get(name)
    if value is None or isinstance(value, list) or value == "auto":
        return None
    return None if int(value) == -1 and name == "max-model-len" else int(value)


def _float(flags: Mapping[str, FlagValue], name: str, default: float) -> float:
    value = flags.get(name)
    return default if value is None or isinstance(value, list) else float(value)


def _bool(flags: Mapping[str, FlagValue], name: str, default: bool) -> bool:
    value = flags.get(name)
    return default if value is None else value is not False


def resolve(flags: Mapping[str, FlagValue], platform: Platform | None = None, model: ModelLimits | None = None,
            env: Mapping[str, str] | None = None) -> ServeConfig:
    """Apply vLLM's defaults and startup rules to typed flags (see `FlagSpec.coerce`), in vLLM's
    order; raises VllmRuleError with vLLM's message."""
    env = env or {}
    tp = _int(flags, "tensor-parallel-size")
    tp = defaults.TENSOR_PARALLEL_SIZE if tp is None else tp
    if tp < 1:
        raise _field("ParallelConfig", "tensor_parallel_size", "Input should be greater than 0", "greater_than", tp)
    if model is not None and model.num_heads % tp:
        raise VllmRuleError("plain", f"Total number of attention heads ({model.num_heads}) must be divisible by "
                            f"tensor parallel size ({tp}).", flags=("tensor-parallel-size",))
    pp = _int(flags, "pipeline-parallel-size") or 1
    world = tp * pp
    if platform is not None and platform.count is not None and not platform.is_cpu and world > platform.count:
        raise VllmRuleError("plain", f"World size ({world}) is larger than the number of available GPUs "
                            f"({platform.count}) in this node. If this is intentional and you are using: "
                            "- ray, set '--distributed-executor-backend ray'.",
                            flags=("tensor-parallel-size", "pipeline-parallel-size"))
    util = _float(flags, "gpu-memory-utilization", defaults.GPU_MEMORY_UTILIZATION)
    if util > 1:
        raise _field("CacheConfig", "gpu_memory_utilization", "Input should be less than or equal to 1",
                     "less_than_equal", util)
    if util <= 0:
        raise _field("CacheConfig", "gpu_memory_utilization", "Input should be greater than 0", "greater_than",
                     util)
    offload = _float(flags, "cpu-offload-gb", defaults.CPU_OFFLOAD_GB)
    if offload < 0:
        raise _field("UVAOffloadConfig", "cpu_offload_gb", "Input should be greater than or equal to 0",
                     "greater_than_equal", offload)
    backend, group, in_group, step = _offload(flags, offload)
    block_size = _int(flags, "block-size")
    block_size = defaults.BLOCK_SIZE if block_size is None else block_size
    if block_size < 1:  # 0.32: any positive size (older releases allowed only 1, 8, 16, 32, 64, 128)
        raise _field("CacheConfig", "block_size", "Input should be greater than 0", "greater_than", block_size)

    max_model_len = _int(flags, "max-model-len")
    derived = model.derived_max_model_len if model is not None else None
    if max_model_len is None:
        max_model_len = derived
    if (model is not None and derived is not None and max_model_len is not None and max_model_len > derived
            and not allows_long_max_model_len(env)):
        raise long_max_model_len_error(max_model_len, model)
    if max_model_len is not None and max_model_len < 1:
        raise _field("ModelConfig", "max_model_len", "Input should be greater than 0", "greater_than", max_model_len)

    chunked = _bool(flags, "enable-chunked-prefill", defaults.ENABLE_CHUNKED_PREFILL)
    world_size = tp * (_int(flags, "pipeline-parallel-size") or 1)
    default_tokens, default_seqs = scheduler_defaults(platform, world_size) if platform is not None \
        else (None, None)
    given_seqs = _int(flags, "max-num-seqs")
    budget = _int(flags, "max-num-batched-tokens")
    if budget is None and default_tokens is not None:
        budget = default_tokens if chunked or max_model_len is None else max(max_model_len, default_tokens)
        seqs_first = given_seqs if given_seqs is not None else default_seqs
        if max_model_len is not None and seqs_first is not None:
            budget = min(seqs_first * max_model_len, budget)  # a default never exceeds what seqs × len need
    seqs = given_seqs
    if seqs is None and default_seqs is not None and budget is not None:
        seqs = min(default_seqs, budget)
    for name, value in (("max_num_batched_tokens", budget), ("max_num_seqs", seqs)):
        if value is not None and value < 1:
            raise _field("SchedulerConfig", name, "Input should be greater than 0", "greater_than", value)
    if not chunked and budget is not None and max_model_len is not None and budget < max_model_len:
        raise VllmRuleError(
            "value",
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
            "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
            "max_model_len.",
            "SchedulerConfig", flags=("max-num-batched-tokens", "max-model-len", "enable-chunked-prefill"))
    if budget is not None and seqs is not None and budget < seqs:
        raise VllmRuleError(
            "value", f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs}).",
            "SchedulerConfig", flags=("max-num-batched-tokens", "max-num-seqs"))
    return ServeConfig(tp, max_model_len, budget, seqs, util, offload, chunked,
                       _bool(flags, "enable-prefix-caching", defaults.ENABLE_PREFIX_CACHING), block_size,
                       backend, group, in_group, step)


def long_max_model_len_error(max_model_len: int, model: ModelLimits) -> VllmRuleError:
    """vllm/config/model.py `_get_and_verify_max_len`, when the env variable is not set."""
    return VllmRuleError(
        "value",
        f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
        f"({model.max_len_key}={model.derived_max_model_len} or model_max_length=None in "
        "model's config.json). To allow overriding this maximum, set the env var "
        f"{LONG_MAX_MODEL_LEN_VAR}=1. {LONG_MAX_MODEL_LEN_VAR} must be used with extreme "
        "caution. If the model uses relative position encoding (RoPE), positions exceeding "
        "derived_max_model_len lead to nan. If the model uses absolute position encoding, "
        "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.",
        "ModelConfig", flags=("max-model-len",))


@dataclass(frozen=True)
class CardMemory:
    """One GPU as vLLM's startup accounts for it (bytes): what its KV cache gets is
    utilization × total − weights − the rest (non-torch buffers, the profiled step, CUDA graphs)."""

    total: int
    weights: int  # this GPU's share of the weights, after offload
    rest: int
    kv_per_token: int  # this GPU's share of one token's KV cache


def check_kv_cache(card: CardMemory, utilization: float, max_model_len: int, block_size: int = 16) -> int:
    """vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`: the KV cache must hold one
    max-model-len request; returns the bytes left for it, raises VllmRuleError in vLLM's words."""
    available = math.ceil(card.total * utilization) - card.weights - card.rest
    flags = ("gpu-memory-utilization", "max-model-len", "tensor-parallel-size", "cpu-offload-gb")
    block = card.kv_per_token * block_size
    if available < block:
        raise VllmRuleError("plain", "No available memory for the cache blocks. Try increasing "
                            "`gpu_memory_utilization` when initializing the engine. See "
                            f"{_CONSERVING_MEMORY} for more details.", flags=flags)
    needed = math.ceil(max_model_len / block_size) * block
    if needed > available:
        estimated = (available // block) * block_size
        raise VllmRuleError(
            "plain",
            "To serve at least one request with the model's max seq len "
            f"({max_model_len}), ({needed / GIB:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({available / GIB:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {estimated}. Try increasing `gpu_memory_utilization` "
            f"or decreasing `max_model_len` when initializing the engine. See {_CONSERVING_MEMORY} for "
            "more details.", flags=flags)
    return available


def _offload(flags: Mapping[str, FlagValue], cpu_offload_gb: float) -> tuple[str, int, int, int]:
    """vllm/config/offload.py (0.32): PrefetchOffloadConfig's field bounds, then OffloadConfig's
    validator. Setting both backends is legal there (a warning; `auto` then picks prefetch, an explicit
    backend ignores the other's fields), so it is not a violation here: the backend that runs is
    returned, and the search space never sets both."""
    raw_backend = flags.get("offload-backend")
    requested = defaults.OFFLOAD_BACKEND if raw_backend is None else str(raw_backend)
    group = _int(flags, "offload-group-size")
    group = defaults.OFFLOAD_GROUP_SIZE if group is None else group
    in_group = _int(flags, "offload-num-in-group")
    in_group = defaults.OFFLOAD_NUM_IN_GROUP if in_group is None else in_group
    step = _int(flags, "offload-prefetch-step")
    step = defaults.OFFLOAD_PREFETCH_STEP if step is None else step
    for name, value, low in (("offload_group_size", group, 0), ("offload_num_in_group", in_group, 1),
                             ("offload_prefetch_step", step, 0)):
        if value < low:
            raise _field("PrefetchOffloadConfig", name, f"Input should be greater than or equal to {low}",
                         "greater_than_equal", value)
    if requested == "prefetch" or group > 0:
        if in_group > group:
            raise VllmRuleError("value", f"offload_num_in_group ({in_group}) must be <= offload_group_size "
                                f"({group})", "OffloadConfig", flags=("offload-num-in-group", "offload-group-size"))
        if step < 1:
            raise VllmRuleError("value", f"offload_prefetch_step ({step}) must be >= 1 when prefetch offloading "
                                "is enabled (offload_group_size > 0)", "OffloadConfig",
                                flags=("offload-prefetch-step", "offload-group-size"))
    if requested == "prefetch" or (requested == "auto" and group > 0):
        backend = "prefetch"
    elif cpu_offload_gb > 0 and requested in ("auto", "uva"):
        backend = "uva"
    else:
        backend = "none"
    return backend, group, in_group, step
