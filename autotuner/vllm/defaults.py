"""vLLM 0.32's defaults for `vllm serve`, which depend on the platform (facts note §2)."""

from __future__ import annotations

from dataclasses import dataclass

GPU_MEMORY_UTILIZATION = 0.92
CPU_OFFLOAD_GB = 0.0
# vllm/config/offload.py: OffloadConfig / PrefetchOffloadConfig (G = 0: prefetch off).
OFFLOAD_BACKEND = "auto"
OFFLOAD_GROUP_SIZE = 0
OFFLOAD_NUM_IN_GROUP = 1
OFFLOAD_PREFETCH_STEP = 1
BLOCK_SIZE = 16
TENSOR_PARALLEL_SIZE = 1
ENABLE_CHUNKED_PREFILL = True
ENABLE_PREFIX_CACHING = True


@dataclass(frozen=True)
class Platform:
    """What vLLM's defaults and startup rules depend on: the device kind and how many the engine sees."""

    name: str  # NVML's product name, e.g. "NVIDIA GeForce RTX 3090"; "cpu" for vLLM's CPU backend
    memory_gib: float  # per device, as NVML reports the total
    count: int | None = None  # devices the engine can use; None when unknown

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"


def scheduler_defaults(platform: Platform, world_size: int = 1) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks when they are not given
    (vllm/engine/arg_utils.py `get_batch_defaults`, API server usage context).

    GPUs by memory: ≥160 GiB → 16384 / 1024; ≥70 GiB except A100 → 8192 / 1024; else 2048 / 256.
    The CPU backend: 2048 / 128 per rank (world size = TP × PP).
    """
    if platform.is_cpu:
        return 2048 * world_size, 128 * world_size
    if platform.memory_gib >= 160:
        return 16384, 1024
    if platform.memory_gib >= 70 and "A100" not in platform.name:
        return 8192, 1024
    return 2048, 256
