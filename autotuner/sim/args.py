"""The `vllm serve` command line as the simulator understands it, with vLLM 0.32's defaults,
validation messages and exit codes (unknown flag or unparsable value: 2; invalid value or
combination: 1).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autotuner.errors import HardwareSpecError, ModelSpecError
from autotuner.sim.hardware import GIB, GpuSpec, load_gpu
from autotuner.sim.models import ModelSpec, load_model
from autotuner.sim.noise import DEFAULT_LEVEL as DEFAULT_NOISE

VLLM_VERSION = "0.32.0"
# Fast enough that a trial takes seconds, slow enough that the server keeps pace with its scaled
# clock on 2 cores (benchmarks/sim_timing_fidelity.py; at 30 the wall overhead per step shows).
DEFAULT_SPEEDUP = 10.0
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)

# Real vLLM flags the simulator accepts and ignores, so that configs written for vLLM run unchanged.
_ACCEPTED_VALUE_FLAGS = (
    "--dtype", "--seed", "--tokenizer", "--download-dir", "--load-format", "--swap-space",
    "--uvicorn-log-level", "--distributed-executor-backend", "--generation-config",
    "--shutdown-timeout", "--quantization", "--revision",
)  # fmt: skip
_ACCEPTED_BARE_FLAGS = ("--trust-remote-code", "--disable-log-requests", "--disable-log-stats")


class VllmArgError(Exception):
    """What vLLM would print before exiting with `exit_code`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class SimOptions:
    gpu: GpuSpec
    num_gpus: int
    speedup: float
    seed: int
    noise: float = DEFAULT_NOISE
    run: int | None = None  # None: the server counts its launches (sim/noise.py)
    ignore_cpu_offload: bool = False  # behave like vLLM builds that silently drop --cpu-offload-gb


@dataclass(frozen=True)
class EngineConfig:
    """A validated engine configuration: what `vllm serve` would run with."""

    model: ModelSpec
    model_arg: str
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    cpu_offload_gb: float
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    block_size: int
    enforce_eager: bool
    kv_cache_dtype: str
    sim: SimOptions
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default=None, repr=False)
    gpu_indices: tuple[int, ...] = ()

    @property
    def kv_dtype_bytes(self) -> int:
        return 1 if self.kv_cache_dtype.startswith("fp8") else self.model.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Per GPU."""
        per = self.model.kv_bytes_per_token(self.tensor_parallel_size)
        return per // self.model.dtype_bytes * self.kv_dtype_bytes

    @property
    def offload_bytes(self) -> int:
        if self.sim.ignore_cpu_offload:
            return 0
        return min(int(self.cpu_offload_gb * GIB), self.model.weight_bytes // self.tensor_parallel_size)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise VllmArgError(f"{self.format_usage()}{self.prog}: error: {message}", 2)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The vLLM flags the simulator models, and its own `--sim-*` flags."""
    parser.add_argument("model_tag", nargs="?", help="preset name or directory with config.json")
    parser.add_argument("--model", dest="model_flag", help="same as the positional MODEL")
    parser.add_argument("--config", help="YAML file of long option names; the command line wins")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--api-key")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    parser.add_argument("--cpu-offload-gb", type=float, default=0.0)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    for flag in _ACCEPTED_VALUE_FLAGS:
        parser.add_argument(flag, help=argparse.SUPPRESS)
    for flag in _ACCEPTED_BARE_FLAGS:
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    sim = parser.add_argument_group("simulator")
    sim.add_argument("--sim-gpu", default="rtx-3090", help="a GPU preset or a YAML file describing one")
    sim.add_argument("--sim-gpus", type=int, help="GPUs in the simulated box (default: the TP size)")
    sim.add_argument("--sim-speedup", type=float, default=DEFAULT_SPEEDUP, help="simulated time / wall time")
    sim.add_argument("--sim-seed", type=int, default=0)
    sim.add_argument("--sim-noise", type=float, default=DEFAULT_NOISE,
                     help="run-to-run coefficient of variation (0: deterministic)")
    sim.add_argument("--sim-run", type=int, help="which run of this seed (default: counted per launch)")
    sim.add_argument("--sim-ignore-cpu-offload", action="store_true", help=argparse.SUPPRESS)


def new_parser(prog: str = "vllm", conflict_handler: str = "error") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, allow_abbrev=True, conflict_handler=conflict_handler)
    add_engine_flags(parser)
    return parser


def config_file_argv(path: str) -> list[str]:
    """`vllm serve --config f.yaml`: keys are long options; true → bare flag, false → --no-x."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise VllmArgError(f"vllm: error: cannot read config file {path}: {exc}", 2) from exc
    if data is None:
        return []
    if not isinstance(data, dict):
        raise VllmArgError(f"vllm: error: config file {path} must hold a mapping of option names", 2)
    argv: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def parse_args(
    argv: Sequence[str],
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    parser = parser or new_parser()
    argv = list(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        # vLLM puts the file's options first so that the command line wins.
        argv = config_file_argv(known.config) + argv
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return ns


def _validation(cls: str, field_name: str, text: str, kind: str, value: object) -> VllmArgError:
    return VllmArgError(
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}\n{field_name}\n"
        f"  {text} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]",
        1,
    )


def _value_error(cls: str, text: str) -> VllmArgError:
    return VllmArgError(
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}\n"
        f"  Value error, {text} [type=value_error]",
        1,
    )


def _default_limits(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM 0.32's `vllm serve` defaults for (max_num_batched_tokens, max_num_seqs) by GPU memory."""
    if gpu.memory_gib >= 160:
        return 16384, 1024
    if gpu.memory_gib >= 70 and "A100" not in gpu.product_name:
        return 8192, 1024
    return 2048, 256


def build_config(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> EngineConfig:
    """Validate like vLLM; raises VllmArgError (exit 1) or a UserInputError for --sim-* inputs."""
    env = os.environ if env is None else env
    model_arg = ns.model_tag or ns.model_flag
    if not model_arg:
        raise VllmArgError("vllm: error: the following arguments are required: model_tag", 2)
    try:
        model = load_model(model_arg)
    except ModelSpecError as exc:
        raise VllmArgError(f"OSError: {exc}", 1) from exc
    gpu = load_gpu(ns.sim_gpu)
    tp = ns.tensor_parallel_size
    num_gpus = ns.sim_gpus if ns.sim_gpus is not None else tp
    if tp < 1:
        raise _validation("ParallelConfig", "tensor_parallel_size", "Input should be greater than 0",
                          "greater_than", tp)
    if num_gpus < 1 or ns.sim_speedup <= 0:
        raise HardwareSpecError("--sim-gpus must be ≥ 1 and --sim-speedup > 0")
    if not 0 <= ns.sim_noise <= 0.5 or (ns.sim_run is not None and ns.sim_run < 0):
        raise HardwareSpecError("--sim-noise must be within 0..0.5 (0.03 = 3 % run-to-run) and --sim-run ≥ 0")
    if model.num_heads % tp:
        raise VllmArgError(
            f"ValueError: Total number of attention heads ({model.num_heads}) must be divisible by "
            f"tensor parallel size ({tp}).",
            1,
        )
    gpu_indices = _visible_gpus(env, num_gpus)
    if tp > len(gpu_indices):
        raise VllmArgError(
            f"ValueError: World size ({tp}) is larger than the number of available GPUs "
            f"({len(gpu_indices)}) in this node. If this is intentional and you are using: "
            "- ray, set '--distributed-executor-backend ray'.",
            1,
        )
    util = ns.gpu_memory_utilization
    if util > 1:
        raise _validation("CacheConfig", "gpu_memory_utilization", "Input should be less than or equal to 1",
                          "less_than_equal", util)
    if util <= 0:
        raise _validation("CacheConfig", "gpu_memory_utilization", "Input should be greater than 0",
                          "greater_than", util)
    if ns.cpu_offload_gb < 0:
        raise _validation("CacheConfig", "cpu_offload_gb", "Input should be greater than or equal to 0",
                          "greater_than_equal", ns.cpu_offload_gb)
    block_size = ns.block_size if ns.block_size is not None else 16
    if block_size not in BLOCK_SIZES:
        raise _validation("CacheConfig", "block_size", "Input should be 1, 8, 16, 32, 64 or 128",
                          "literal_error", block_size)

    derived = model.derived_max_model_len
    max_model_len = ns.max_model_len if ns.max_model_len is not None else derived
    if max_model_len > derived and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") not in ("1", "true", "True"):
        raise _value_error(
            "ModelConfig",
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={model.max_position_embeddings} or model_max_length=None in "
            "model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme "
            "caution. If the model uses relative position encoding (RoPE), positions exceeding "
            "derived_max_model_len lead to nan. If the model uses absolute position encoding, "
            "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.",
        )
    if max_model_len < 1:
        raise _validation("ModelConfig", "max_model_len", "Input should be greater than 0",
                          "greater_than", max_model_len)

    chunked = True if ns.enable_chunked_prefill is None else ns.enable_chunked_prefill
    default_tokens, default_seqs = _default_limits(gpu)
    if ns.max_num_batched_tokens is not None:
        budget = ns.max_num_batched_tokens
    else:
        budget = default_tokens if chunked else max(max_model_len, default_tokens)
    seqs = ns.max_num_seqs if ns.max_num_seqs is not None else min(default_seqs, budget)
    if budget < 1 or seqs < 1:
        raise _validation("SchedulerConfig", "max_num_batched_tokens" if budget < 1 else "max_num_seqs",
                          "Input should be greater than 0", "greater_than", min(budget, seqs))
    if not chunked and budget < max_model_len:
        raise _value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
            "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
            "max_model_len.",
        )
    if budget < seqs:
        raise _value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs}).",
        )

    api_key = ns.api_key or env.get("VLLM_API_KEY") or None
    return EngineConfig(
        model=model,
        model_arg=model_arg,
        served_model_names=tuple(ns.served_model_name or [model_arg]),
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        gpu_memory_utilization=util,
        cpu_offload_gb=ns.cpu_offload_gb,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=True if ns.enable_prefix_caching is None else ns.enable_prefix_caching,
        block_size=block_size,
        enforce_eager=ns.enforce_eager,
        kv_cache_dtype=ns.kv_cache_dtype,
        sim=SimOptions(gpu=gpu, num_gpus=num_gpus, speedup=ns.sim_speedup, seed=ns.sim_seed,
                       noise=ns.sim_noise, run=ns.sim_run, ignore_cpu_offload=ns.sim_ignore_cpu_offload),
        host=ns.host,
        port=ns.port,
        api_key=api_key,
        gpu_indices=tuple(gpu_indices[:tp]),
    )


def _visible_gpus(env: Mapping[str, str], num_gpus: int) -> list[int]:
    """CUDA_VISIBLE_DEVICES picks the simulated box's GPUs, as on a real one."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(num_gpus))
    indices: list[int] = []
    for raw_part in raw.split(","):
        part = raw_part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) >= num_gpus:
            break  # CUDA stops at the first invalid entry
        indices.append(int(part))
    return indices
