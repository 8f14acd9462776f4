"""Step time from a roofline: what one engine step costs on the simulated GPUs.

    step = max(GPU work, kernel launches) + fixed overhead
    GPU work = linear layers + attention + offloaded weights over PCIe + TP all-reduces

- linear layers: max(streamed weight bytes / bandwidth, FLOPs / tensor throughput), where the decoder
  layers multiply every token and the output projection (lm_head) only the rows being sampled — one
  per request, not one per prompt token — and an untied input embedding is gathered, not streamed;
- attention, a kernel of its own: max(KV bytes attended / bandwidth, attention FLOPs / throughput);
- UVA offload (`--cpu-offload-gb`): every step's kernels read the offloaded weights over PCIe in
  place (zero-copy), the host's fabric shared by the TP ranks; that time adds to the step
  (facts note §3: ~45 ms per GiB on a 3090, #22692's 6.4 tok/s at TP 8 with 16 GB offloaded);
- prefetch offload (`--offload-backend prefetch`): every forward pass copies each offloaded layer
  back (async H2D on a copy stream, S layers ahead) over the same shared fabric, overlapped with the
  compute of the layers before it, so GPU work = max(compute, copies) plus a wait/start pair of custom
  ops per offloaded layer (PREFETCH_SYNC_PER_LAYER_S). The bytes crossing PCIe per step are the same
  as UVA's for the same layers; prefetch only hides them behind compute, so it gains at most 2× over
  UVA at equal bytes, and least where the copies dwarf the compute (decode of a big model with many
  GiB offloaded). No published throughput figures for the prefetch backend exist (searched vLLM's
  issues and docs, Nov 2026); the overlap is the design's claim (vllm/config/offload.py), the
  per-layer sync cost an estimate. S only buys GPU buffers here: we assume S ≥ 1 suffices to keep the
  copy stream busy, which holds when a layer's copy fits the compute between offloaded layers;
- two all-reduces per layer (latency + ring traffic) over NVLink or PCIe;
- kernel launches: steps up to vLLM's CUDA-graph capture size (min(2 × max_num_seqs, 512,
  max_num_batched_tokens), vllm/config/vllm.py) replay a graph; larger steps and --enforce-eager
  launch per layer, and the CPU launching overlaps the GPU computing, so only launch-bound steps pay;
- a fixed scheduler/sampler/host cost per step, and a little per scheduled request.

The tensor throughput of a GPU preset is its dense fp16/bf16 rate with fp32 accumulate, which is what
PyTorch's GEMMs use: on GeForce cards that is half the datasheet's fp16-accumulate figure (RTX 3090
71 not 142, RTX 4090 165 not 330 TFLOP/s).

A box file's deviation (catalog.gpus.BoxDeviation) scales the bandwidth and the compute rates, sets
the step overhead, and shapes the linear layers' compute rate by the step's tokens; presets have none.

Calibration: the published vLLM runs of benchmarks/data/published_runs.yaml (benchmarks/sim_accuracy.py
prints the error per row) and the facts note §3/§5 (offload cost, #22692's TP8 offload throughput);
`tests/sim/test_calibration.py` pins the field reports. Each constant says where it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotuner.sim.args import EngineConfig

# Fraction of peak memory bandwidth a weight/KV stream achieves: GEMV-class kernels reach 80-90 % of
# the datasheet bandwidth; 0.85 with STEP_OVERHEAD_S reproduces the batch-1 TPOT rows of the table
# (4090 Qwen3-4B, A100 Qwen3-1.7B, A100-40GB Llama-3.1-8B) within ±10 %.
MEMORY_EFFICIENCY = 0.85
# The RTX 4090 streams its weights closer to the datasheet: tt-inference-server#394's batch-1 TPOT of
# Qwen3-4B (8.04 GB streamed) is 10.3–10.9 ms, i.e. 946 GB/s = 0.94 of 1008 after STEP_OVERHEAD_S, and
# the 2×4090 Qwen2.5-14B concurrency-1 row (13.9 GB a rank, 18.4 ms a token) needs about the same. (Ada's
# 72 MB L2 holds the activations and KV of a batch-1 step, so more of the DRAM traffic is the weights
# themselves; an explanation, not a measurement.) The RTX 3090's batch-1 rows fit 0.85.
MEMORY_EFFICIENCY_BY_PRODUCT = {"NVIDIA GeForce RTX 4090": 0.94}
# Fraction of dense tensor throughput the linear layers reach on large steps. The table's rows whose
# TTFT is one prefill of 256–1024 tokens (4090 Mistral-7B at concurrency 4 and 8, A100 Qwen3-1.7B at
# 1024 tokens) come out within ±10 % at 0.70 and 10–25 % slow at the former hand-set 0.60. The
# high-concurrency rows pull the other way (see the README's simulator section): not fitted to them.
LINEAR_MFU = 0.70
# Attention kernels (FlashAttention-2 class) reach less of the tensor peak than GEMMs.
ATTENTION_MFU = 0.40
# A GEMM fills the GPU only with enough output tiles: efficiency ramps as (T + T0) / (T + H) with
# H = GEMM_FILL_OUTPUTS / (hidden / TP) tokens. Narrow TP shards (13B at TP 8: 640 columns) need
# hundreds of tokens per step; a TP-1 7B needs tens. T0 = GEMM_SMALL_STEP_FRACTION × H keeps small
# decode steps on the memory roof, where split-K kernels put them.
GEMM_FILL_OUTPUTS = 350_000
GEMM_SMALL_STEP_FRACTION = 0.15
# One all-reduce's latency, with what the TP ranks pay around it each layer (launch, sync), growing with
# log2(TP) as a ring or tree does. NVLink: vllm#16300 (8×A100 80GB, QwQ-32B, 64 layers, vLLM 0.7.2,
# batch 1): 5.50 / 3.91 / 3.15 s for 200 tokens at TP 2 / 4 / 8 leave, after the weight stream at
# MEMORY_EFFICIENCY and STEP_OVERHEAD_S, 6.8 / 8.7 / 9.3 ms per step over 128 all-reduces: 53 / 68 / 73 µs,
# fitted by 45 + 10·log2(TP) µs (it was 10 µs flat, an estimate, which made TP 8 1.9x too fast). PCIe
# without P2P (GeForce cards on the stock driver: NCCL stages through host memory, club-3090#356 "roughly 2×
# the latency" of a P2P Gen4 rig): no clean per-op figure; 60 µs (est.) at TP 2 with the same growth.
ALLREDUCE_LATENCY_PCIE_S = 50e-6
ALLREDUCE_LATENCY_NVLINK_S = 45e-6
ALLREDUCE_LATENCY_PER_DOUBLING_S = 10e-6
# Host-side PCIe fabric shared by every GPU reading offloaded weights at once.
HOST_PCIE_TOTAL_GBPS = 64.0
# Scheduler, input preparation, sampling and output processing per step: the batch-1 TPOT rows of
# the table minus their weight stream at MEMORY_EFFICIENCY leave 0.9 ms (4090, Qwen3-4B), 1.9 ms
# (A100-40GB, Llama-3.1-8B) and 2.6 ms (A100, Qwen3-1.7B); the median is 1.9 ms. (It was 3 ms, set by
# hand before any published run was compared.)
STEP_OVERHEAD_S = 1.9e-3
# Prefetch offload: wait_prefetch + start_prefetch custom ops and event syncs per offloaded layer and
# step (an estimate: a few stream-event operations, ~10 µs each; no published figure).
PREFETCH_SYNC_PER_LAYER_S = 30e-6
PER_REQUEST_OVERHEAD_S = 15e-6
# Kernel launches per layer for a step that cannot replay a CUDA graph.
EAGER_LAUNCH_PER_LAYER_S = 110e-6
# vLLM's default largest CUDA-graph capture size (vllm/config/vllm.py: min(2 × max_num_seqs, 512)).
CUDAGRAPH_MAX_CAPTURE = 512


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
        self._deviation = dev = gpu.deviation
        efficiency = MEMORY_EFFICIENCY_BY_PRODUCT.get(gpu.product_name, MEMORY_EFFICIENCY)
        self._bw = efficiency * dev.bandwidth_efficiency * gpu.bandwidth_gbps * 1e9
        self._linear_flops = gpu.fp16_tflops * 1e12 * LINEAR_MFU
        self._fill_tokens = GEMM_FILL_OUTPUTS / (model.hidden_size / tp)
        self._small_tokens = GEMM_SMALL_STEP_FRACTION * self._fill_tokens
        self._attn_flops = gpu.fp16_tflops * 1e12 * ATTENTION_MFU * dev.compute_efficiency
        self._overhead = STEP_OVERHEAD_S if dev.step_overhead_s is None else dev.step_overhead_s
        # Weights streamed from HBM: prefetched layers are read from their GPU buffers like any other.
        self._weights = max(0, model.streamed_bytes // tp - config.offload_bytes)
        self._token_params = model.token_params / tp
        self._head_params = model.lm_head_params / tp
        self._kv_per_token = config.kv_bytes_per_token
        self._attn_flops_per_pair = 4 * model.num_layers * (model.num_heads // tp) * model.head_dim
        pcie = min(gpu.pcie_gbps, HOST_PCIE_TOTAL_GBPS / tp) * 1e9
        self._offload_s = config.offload_bytes / pcie if config.offload_bytes else 0.0
        self._prefetch_s = config.prefetch_bytes / pcie if config.prefetch_bytes else 0.0
        self._prefetch_sync_s = config.prefetch_layers * PREFETCH_SYNC_PER_LAYER_S
        self._num_allreduce = 2 * model.num_layers if tp > 1 else 0
        latency = ALLREDUCE_LATENCY_NVLINK_S if gpu.nvlink_gbps > 0 else ALLREDUCE_LATENCY_PCIE_S
        self._ar_latency = latency + ALLREDUCE_LATENCY_PER_DOUBLING_S * math.log2(tp) if tp > 1 else 0.0
        self._ar_bytes_per_token = model.hidden_size * model.dtype_bytes * 2 * (tp - 1) / tp
        self._link = gpu.link_gbps * 1e9
        self._eager_launch = model.num_layers * EAGER_LAUNCH_PER_LAYER_S
        self._always_eager = config.enforce_eager
        self._graph_tokens = min(2 * config.max_num_seqs, CUDAGRAPH_MAX_CAPTURE, config.max_num_batched_tokens)

    def step_seconds(self, shape: StepShape) -> float:
        t = shape.num_tokens
        ramp = (t + self._small_tokens) / (t + self._fill_tokens)
        flops = 2 * (self._token_params * t + self._head_params * min(shape.num_requests, t))
        rate = self._linear_flops * ramp * self._deviation.compute_factor(t)
        linear = max(self._weights / self._bw, flops / rate)
        attention = max(
            shape.kv_tokens_read * self._kv_per_token / self._bw,
            self._attn_flops_per_pair * shape.attention_pairs / self._attn_flops,
        )
        allreduce = self._num_allreduce * (self._ar_latency + t * self._ar_bytes_per_token / self._link)
        gpu = max(linear + attention + self._offload_s + allreduce, self._prefetch_s) + self._prefetch_sync_s
        launches = self._eager_launch if self._always_eager or t > self._graph_tokens else 0.0
        return max(gpu, launches) + self._overhead + PER_REQUEST_OVERHEAD_S * shape.num_requests
