"""Step time from a roofline: what one engine step costs on the simulated GPUs.

    step = linear layers + attention + offloaded weights over PCIe + TP all-reduces + overheads

- linear layers: max(resident weight bytes / bandwidth, 2·params·tokens / tensor throughput);
- attention, a kernel of its own: max(KV bytes attended / bandwidth, attention FLOPs / throughput);
- every step reads the offloaded weights over PCIe (UVA zero-copy), the host's fabric shared by the
  TP ranks;
- two all-reduces per layer (latency + ring traffic) over NVLink or PCIe;
- a fixed scheduler/sampler cost per step, and kernel launches per layer for steps that carry a
  prefill (decode-only steps replay a captured CUDA graph unless --enforce-eager).

Calibration: facts note §3 and §5 (1×4090 Mistral-7B concurrency points, 1 GiB offload ≈ +45 ms on a
3090 decode step, #22692's TP8 offload throughput); `tests/sim/test_calibration.py` pins them.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.sim.args import EngineConfig

# Fraction of peak memory bandwidth a weight/KV stream achieves.
MEMORY_EFFICIENCY = 0.85
# Fraction of dense fp16 tensor throughput the linear layers reach on large steps, and attention.
LINEAR_MFU = 0.60
ATTENTION_MFU = 0.40
# A GEMM fills the GPU only with enough output tiles: efficiency ramps as (T + T0) / (T + H) with
# H = GEMM_FILL_OUTPUTS / (hidden / TP) tokens. Narrow TP shards (13B at TP 8: 640 columns) need
# hundreds of tokens per step; a TP-1 7B needs tens. T0 = GEMM_SMALL_STEP_FRACTION × H keeps small
# decode steps on the memory roof, where split-K kernels put them.
GEMM_FILL_OUTPUTS = 350_000
GEMM_SMALL_STEP_FRACTION = 0.15
# One all-reduce's latency: NCCL ring over PCIe without P2P, and over NVLink.
ALLREDUCE_LATENCY_PCIE_S = 60e-6
ALLREDUCE_LATENCY_NVLINK_S = 10e-6
# Host-side PCIe fabric shared by every GPU reading offloaded weights at once.
HOST_PCIE_TOTAL_GBPS = 64.0
# Scheduler, input preparation and sampling per step, and per scheduled request.
STEP_OVERHEAD_S = 3.0e-3
PER_REQUEST_OVERHEAD_S = 15e-6
# Kernel launches per layer when the step cannot replay a CUDA graph (mixed prefill steps).
EAGER_LAUNCH_PER_LAYER_S = 110e-6


@dataclass(frozen=True)
class StepShape:
    """What one step computes: tokens, and for each scheduled request its new tokens and context."""

    num_tokens: int
    num_requests: int
    kv_tokens_read: int  # sum over requests of the context attended to (after the step)
    attention_pairs: int  # sum over requests of query tokens × average keys attended
    has_prefill: bool = False


class Roofline:
    def __init__(self, config: EngineConfig) -> None:
        gpu = config.sim.gpu
        model = config.model
        tp = config.tensor_parallel_size
        self._bw = MEMORY_EFFICIENCY * gpu.bandwidth_gbps * 1e9
        self._linear_flops = gpu.fp16_tflops * 1e12 * LINEAR_MFU
        self._fill_tokens = GEMM_FILL_OUTPUTS / (model.hidden_size / tp)
        self._small_tokens = GEMM_SMALL_STEP_FRACTION * self._fill_tokens
        self._attn_flops = gpu.fp16_tflops * 1e12 * ATTENTION_MFU
        self._weights = model.weight_bytes // tp - config.offload_bytes
        self._params = model.num_params / tp
        self._kv_per_token = config.kv_bytes_per_token
        self._attn_flops_per_pair = 4 * model.num_layers * (model.num_heads // tp) * model.head_dim
        pcie = min(gpu.pcie_gbps, HOST_PCIE_TOTAL_GBPS / tp) * 1e9
        self._offload_s = config.offload_bytes / pcie if config.offload_bytes else 0.0
        self._num_allreduce = 2 * model.num_layers if tp > 1 else 0
        latency = ALLREDUCE_LATENCY_NVLINK_S if gpu.nvlink_gbps > 0 else ALLREDUCE_LATENCY_PCIE_S
        self._ar_latency = latency
        self._ar_bytes_per_token = model.hidden_size * model.dtype_bytes * 2 * (tp - 1) / tp
        self._link = gpu.link_gbps * 1e9
        self._eager_launch = model.num_layers * EAGER_LAUNCH_PER_LAYER_S
        self._always_eager = config.enforce_eager

    def step_seconds(self, shape: StepShape) -> float:
        t = shape.num_tokens
        ramp = (t + self._small_tokens) / (t + self._fill_tokens)
        linear = max(self._weights / self._bw, 2 * self._params * t / (self._linear_flops * ramp))
        attention = max(
            shape.kv_tokens_read * self._kv_per_token / self._bw,
            self._attn_flops_per_pair * shape.attention_pairs / self._attn_flops,
        )
        allreduce = self._num_allreduce * (self._ar_latency + t * self._ar_bytes_per_token / self._link)
        overhead = STEP_OVERHEAD_S + PER_REQUEST_OVERHEAD_S * shape.num_requests
        if shape.has_prefill or self._always_eager:
            overhead += self._eager_launch
        return linear + attention + self._offload_s + allreduce + overhead
