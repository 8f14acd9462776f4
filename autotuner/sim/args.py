"""The `vllm serve` command line as the simulator understands it, with vLLM 0.32's defaults,
validation messages and exit codes (unknown flag or unparsable value: 2; invalid value or
combination: 1).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from autotuner.catalog.gpus import GIB, GpuSpec, load_gpu
from autotuner.catalog.models import ModelSpec, load_model
from autotuner.errors import AutotunerError, HardwareSpecError, ModelSpecError
from autotuner.sim.noise import DEFAULT_LEVEL as DEFAULT_NOISE
from autotuner.vllm import SIMULATED_VERSION, ModelLimits, Platform, ServeConfig, VllmRuleError, knowledge_for
from autotuner.vllm.cmdline import (
    ConfigFileError,
    add_serve_arguments,
    config_file_argv,
    given_flags,
    normalise_options,
)

VLLM_VERSION = SIMULATED_VERSION
# Fast enough that a trial takes seconds, slow enough that the server keeps pace with its scaled
# clock on 2 cores (benchmarks/sim_timing_fidelity.py; at 30 the wall overhead per step shows).
DEFAULT_SPEEDUP = 10.0
# The vLLM version whose flags, defaults and rules the simulator follows.
VLLM = knowledge_for(SIMULATED_VERSION)
# The options `--help` lists: the flags the simulator models (the others are accepted and ignored).
SHOWN_OPTIONS = frozenset({"api-key", *(spec.name for spec in VLLM.flags.values() if spec.modeled)})


class VllmArgError(AutotunerError):
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
    within: float = 0.0  # spread between replays on one engine (sim/noise.py; the virtual core's replays)
    replay: int = 0
    ignore_cpu_offload: bool = False  # behave like vLLM builds that silently drop --cpu-offload-gb


@dataclass(frozen=True, kw_only=True)
class EngineConfig(ServeConfig):
    """A validated engine configuration: what `vllm serve` would run with (vLLM's resolved settings,
    `ServeConfig`, never None here: the simulator knows its platform and model) and what the simulator
    needs besides."""

    model: ModelSpec
    model_arg: str
    served_model_names: tuple[str, ...]
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
        """UVA: weight bytes per GPU read over PCIe in place (zero-copy) on every forward pass."""
        if self.sim.ignore_cpu_offload or self.offload_backend != "uva":
            return 0
        return min(int(self.cpu_offload_gb * GIB), self.model.weight_bytes // self.tensor_parallel_size)

    @property
    def layer_bytes(self) -> int:
        """One decoder layer's weights on one GPU."""
        return self.model.params_per_layer * self.model.dtype_bytes // self.tensor_parallel_size

    @property
    def prefetch_layers(self) -> int:
        """Layers the prefetch backend keeps in host RAM: the last K of every group of G (vLLM's
        `should_offload_module`: index % G >= G - K), so a partial last group offloads fewer."""
        g, k = self.offload_group_size, self.offload_num_in_group
        if self.offload_backend != "prefetch" or g <= 0:
            return 0
        full, rest = divmod(self.model.num_layers, g)
        return full * k + max(0, rest - (g - k))

    @property
    def prefetch_bytes(self) -> int:
        """Prefetch: weight bytes per GPU held in host RAM and copied back before each use."""
        return self.prefetch_layers * self.layer_bytes

    @property
    def prefetch_buffer_bytes(self) -> int:
        """Prefetch: static GPU buffers for the layers in flight (S of them, at most every offloaded one)."""
        return min(self.offload_prefetch_step, self.prefetch_layers) * self.layer_bytes

    @property
    def freed_bytes(self) -> int:
        """GPU memory per GPU that offloading gives back to the KV cache, whatever the backend."""
        return self.offload_bytes + self.prefetch_bytes - self.prefetch_buffer_bytes


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise VllmArgError(f"{self.format_usage()}{self.prog}: error: {message}", 2)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's command line (vllm/cmdline.py, typed as vLLM types it) and the simulator's own `--sim-*`
    options.
    Defaults stay unset here: vLLM's defaults depend on the GPU and are applied in `build_config`."""
    add_serve_arguments(parser, VLLM, typed=True, shown=SHOWN_OPTIONS.__contains__,
                        model_help="preset name or directory with config.json")
    parser.set_defaults(host="127.0.0.1", port=8000)
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


def parse_args(
    argv: Sequence[str],
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    parser = parser or new_parser()
    argv = normalise_options(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        # As vLLM does: the file's options go right after the model tag (when it comes first), before the
        # rest of the command line, so that the command line wins and a list option from the file (e.g.
        # served-model-name) cannot swallow the model tag.
        at = 1 if argv and not argv[0].startswith("-") else 0
        argv = argv[:at] + _config_file_argv(known.config) + argv[at:]
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return ns


def _config_file_argv(path: str) -> list[str]:
    try:
        return config_file_argv(path)
    except ConfigFileError as exc:
        if exc.exc is None:
            raise VllmArgError(f"vllm: error: config file {path} must hold a mapping of option names", 2) from None
        raise VllmArgError(f"vllm: error: cannot read config file {path}: {exc.exc}", 2) from exc.exc


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
    flags = given_flags(ns, VLLM)
    tp = int(flags.get("tensor-parallel-size", 1))  # type: ignore[call-overload]
    num_gpus = ns.sim_gpus if ns.sim_gpus is not None else max(tp, 1)
    if num_gpus < 1 or ns.sim_speedup <= 0:
        raise HardwareSpecError("--sim-gpus must be ≥ 1 and --sim-speedup > 0")
    if not 0 <= ns.sim_noise <= 0.5 or (ns.sim_run is not None and ns.sim_run < 0):
        raise HardwareSpecError("--sim-noise must be within 0..0.5 (0.03 = 3 % run-to-run) and --sim-run ≥ 0")
    gpu_indices = _visible_gpus(env, num_gpus)
    platform = Platform(gpu.product_name, gpu.memory_gib, len(gpu_indices))
    limits = ModelLimits(model.num_heads, model.max_position_embeddings, model.derived_max_model_len)
    try:
        serve = VLLM.resolve(flags, platform, limits, env)  # type: ignore[arg-type]
    except VllmRuleError as exc:
        raise VllmArgError(exc.vllm_message(), 1) from None
    assert serve.max_model_len is not None and serve.max_num_batched_tokens is not None
    assert serve.max_num_seqs is not None

    api_key = ns.api_key or env.get("VLLM_API_KEY") or None
    return EngineConfig(
        **{f.name: getattr(serve, f.name) for f in fields(ServeConfig)},
        model=model,
        model_arg=model_arg,
        served_model_names=tuple(ns.served_model_name or [model_arg]),
        enforce_eager=bool(ns.enforce_eager),
        kv_cache_dtype=ns.kv_cache_dtype or "auto",
        sim=SimOptions(gpu=gpu, num_gpus=num_gpus, speedup=ns.sim_speedup, seed=ns.sim_seed,
                       noise=ns.sim_noise, run=ns.sim_run, ignore_cpu_offload=ns.sim_ignore_cpu_offload),
        host=ns.host,
        port=ns.port,
        api_key=api_key,
        gpu_indices=tuple(gpu_indices[:serve.tensor_parallel_size]),
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
