"""GPU memory as vLLM V1 accounts for it at startup, and as the caching allocator sees it at run time.

Startup (per TP worker), in vLLM's order: snapshot free memory → `requested = util × total` → load
weights → profile one dummy forward of `max_num_batched_tokens` tokens → estimate CUDA-graph memory →
KV cache from the rest. Run time: each step allocates a transient the profile did not cover (attention
over a long context, the sampler's sort), and PyTorch's caching allocator keeps what it reserved, so
the NVML-visible footprint climbs in steps. Beyond the card's total the engine dies with
`torch.OutOfMemoryError`.

Calibration (each constant below is one of the knobs; `tests/sim/test_calibration.py` pins the field
reports they reproduce):
- the facts note's 13B/TP8/3090 estimate (≈3.45 GiB consumed, ≈0.2 GiB activations, ≈0.3 GiB graphs,
  ≈187k KV tokens at util 0.92);
- vLLM #52871 (RTX 5090, util 0.93, budget 8192, ~6000-token prompts → forward-pass OOM);
- the seed's 13B/TP8/3090 story: util 0.80 without chunked prefill OOMs on 3000–6000-token prompts;
  budget 1024 with chunked prefill peaks below 20 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotuner.sim.args import EngineConfig
from autotuner.sim.hardware import GIB

MIB = 1 << 20
# Memory a CUDA context takes in each worker before vLLM's snapshot; not charged to the budget.
CUDA_CONTEXT_BYTES = int(0.30 * GIB)
# Non-torch memory that appears while loading: NCCL buffers with TP > 1, cuBLAS workspaces.
NCCL_BUFFER_BYTES = int(0.42 * GIB)
SINGLE_GPU_NON_TORCH_BYTES = int(0.10 * GIB)
# Profiled sampler: logits [rows, vocab] in float32 plus softmax/sort copies.
SAMPLER_BYTES_PER_LOGIT = 16
# CUDA graphs: estimate subtracted from the budget (0.17–0.36 GiB seen on 3090-class setups).
CUDAGRAPH_BASE_BYTES = int(0.17 * GIB)
CUDAGRAPH_PER_SEQ_BYTES = int(0.19 * GIB) // 512
# Unprofiled attention workspace of a prefill chunk, per GPU. The V2 model runner skips attention
# while profiling (#21652), so this memory was never in the budget. The chunk's new tokens attend to
# each other through a kernel that materialises their scores (per pair of new tokens), and read the
# earlier context through paged KV (per new token × context token, much cheaper). The per-pair figure
# is what makes #52871 and the seed's 13B/TP8 story come out as reported; it does not scale with the
# head count on purpose (calibrated per GPU, not derived).
ATTN_CHUNK_BYTES_PER_PAIR = 360
ATTN_CONTEXT_BYTES_PER_PAIR = 8
# The caching allocator rounds large blocks to 2 MiB and keeps them reserved.
ALLOCATOR_ROUND_BYTES = 2 * MIB


def gib(n: float) -> float:
    """vLLM prints GiB as round(b / 2**30, 2)."""
    return round(n / GIB, 2)


class StartupError(Exception):
    """A startup failure, with the text vLLM logs for it."""

    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.message = message
        self.phase = phase  # "snapshot", "load", "profile" or "kv_cache"


@dataclass(frozen=True)
class MemoryPlan:
    """What startup decided, per GPU worker (all ranks are alike; rank 0 also holds the sampler)."""

    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    offloaded_bytes: int
    non_torch_bytes: int
    activation_peak_bytes: int
    cudagraph_bytes: int
    available_kv_bytes: int
    num_blocks: int
    block_size: int
    kv_bytes_per_token: int
    max_model_len: int

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.kv_cache_tokens / self.max_model_len

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    @property
    def steady_bytes(self) -> int:
        """NVML-visible memory of one worker once serving, before any runtime transient."""
        return (CUDA_CONTEXT_BYTES + self.weights_bytes + self.non_torch_bytes + self.kv_cache_bytes
                + self.cudagraph_bytes)


def attention_workspace_bytes(new_tokens: int, context_tokens: int) -> int:
    """Workspace of one prefill chunk of `new_tokens` ending at `context_tokens` of context."""
    return (new_tokens * new_tokens * ATTN_CHUNK_BYTES_PER_PAIR
            + new_tokens * (context_tokens - new_tokens) * ATTN_CONTEXT_BYTES_PER_PAIR)


def activation_bytes_per_token(config: EngineConfig) -> int:
    m = config.model
    tp = config.tensor_parallel_size
    return m.dtype_bytes * (2 * m.hidden_size + 3 * m.intermediate_size // tp)


def sampler_bytes(config: EngineConfig, rows: int) -> int:
    return rows * config.model.vocab_size * SAMPLER_BYTES_PER_LOGIT


def plan_startup(config: EngineConfig, used_by_others: int = 0) -> MemoryPlan:
    """vLLM V1's startup memory accounting for one worker; raises StartupError as vLLM fails."""
    total = config.sim.gpu.memory_bytes
    util = config.gpu_memory_utilization
    requested = math.ceil(total * util)
    free = total - used_by_others - CUDA_CONTEXT_BYTES
    if free < requested:
        raise StartupError(
            f"ValueError: Free memory on device cuda:0 ({gib(free)}/{gib(total)} GiB) on startup is less "
            f"than desired GPU memory utilization ({util}, {gib(requested)} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes.",
            "snapshot",
        )
    tp = config.tensor_parallel_size
    offloaded = config.offload_bytes
    weights = config.model.weight_bytes // tp - offloaded
    non_torch = NCCL_BUFFER_BYTES if tp > 1 else SINGLE_GPU_NON_TORCH_BYTES
    if used_by_others + CUDA_CONTEXT_BYTES + weights + non_torch > total:
        raise StartupError(
            "ValueError: Failed to load model - not enough GPU memory. Try lowering "
            "--gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, "
            "or using --quantization. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
            "for more tips.\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{math.ceil(weights / MIB)} MiB. GPU 0 has a total capacity of {gib(total)} GiB of which "
            f"{max(0, (total - used_by_others - CUDA_CONTEXT_BYTES) // MIB)} MiB is free.",
            "load",
        )
    budget = config.max_num_batched_tokens
    rows = min(budget, config.max_num_seqs)
    activation = budget * activation_bytes_per_token(config) + sampler_bytes(config, rows)
    if used_by_others + CUDA_CONTEXT_BYTES + weights + non_torch + activation > total:
        raise StartupError(oom_message(activation, total, used_by_others + CUDA_CONTEXT_BYTES + weights
                                       + non_torch, weights + activation), "profile")
    cudagraph = 0 if config.enforce_eager else (
        CUDAGRAPH_BASE_BYTES + CUDAGRAPH_PER_SEQ_BYTES * min(config.max_num_seqs, 512)
    )
    available = requested - weights - non_torch - activation - cudagraph
    kv_per_token = config.kv_bytes_per_token
    block_bytes = kv_per_token * config.block_size
    num_blocks = max(0, available // block_bytes)
    if num_blocks <= 0:
        raise StartupError(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            "kv_cache",
        )
    needed = math.ceil(config.max_model_len / config.block_size) * block_bytes
    if needed > available:
        estimated = (available // block_bytes) * config.block_size
        raise StartupError(
            "ValueError: To serve at least one request with the model's max seq len "
            f"({config.max_model_len}), ({gib(needed)} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({gib(available)} GiB). Based on the available memory, the "
            f"estimated maximum model length is {estimated}. Try increasing `gpu_memory_utilization` "
            "or decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            "kv_cache",
        )
    return MemoryPlan(
        total_bytes=total,
        requested_bytes=requested,
        weights_bytes=weights,
        offloaded_bytes=offloaded,
        non_torch_bytes=non_torch,
        activation_peak_bytes=activation,
        cudagraph_bytes=cudagraph,
        available_kv_bytes=available,
        num_blocks=num_blocks,
        block_size=config.block_size,
        kv_bytes_per_token=kv_per_token,
        max_model_len=config.max_model_len,
    )


def oom_message(tried: int, total: int, in_use: int, allocated: int) -> str:
    free = max(0, total - in_use)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried / MIB:.2f} MiB. GPU 0 has "
        f"a total capacity of {total / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. Including "
        f"non-PyTorch memory, this process has {in_use / GIB:.2f} GiB memory in use. Of the allocated "
        f"memory {allocated / GIB:.2f} GiB is allocated by PyTorch, and {0.0:.2f} MiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


@dataclass
class AllocatorState:
    """The caching allocator's transient pool on one GPU: grows to the largest step, never shrinks."""

    steady_bytes: int
    others_bytes: int
    total_bytes: int
    reserved_bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return self.steady_bytes + self.reserved_bytes

    def allocate(self, transient: int) -> int | None:
        """Run one step needing `transient` bytes. Returns the bytes it failed to get, or None."""
        if transient <= self.reserved_bytes:
            return None
        want = -(-transient // ALLOCATOR_ROUND_BYTES) * ALLOCATOR_ROUND_BYTES
        if self.others_bytes + self.steady_bytes + want > self.total_bytes:
            return want - self.reserved_bytes
        self.reserved_bytes = want
        return None
