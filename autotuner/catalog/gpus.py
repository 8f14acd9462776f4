"""GPU kinds for the simulated box: presets and GPU description files (what a card is: its memory,
bandwidths and throughput; what the simulator makes of them is sim/roofline.py's).

The numbers are the facts note's (§5). `memory_gib` is what NVML reports as the card's total, which
for a "24 GB" RTX 3090 is 23.69 GiB, not 24.

A description file may also say how one box deviates from its preset the way real boxes do
(`BoxDeviation`: efficiency factors, step overhead, non-torch memory, the unprofiled transient, and an
efficiency that depends on the tokens of a step). Presets deviate in nothing. The twin
(autotuner.twin) fits the same scalars from what a box measured; it never reads a box's file.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotuner.errors import HardwareSpecError
from autotuner.filelines import compose_yaml, first_error, line_of, read_text

GIB = 1 << 30


@dataclass(frozen=True)
class BoxDeviation:
    """How a box runs unlike its preset. The defaults change nothing."""

    compute_efficiency: float = 1.0  # × the tensor throughput the linear and attention kernels reach
    bandwidth_efficiency: float = 1.0  # × the memory bandwidth weight and KV streams reach
    step_overhead_s: float | None = None  # the host's fixed cost per step; None: the roofline's constant
    non_torch_gib: float = 0.0  # non-torch memory per GPU beyond the simulator's (drivers, NCCL, cuBLAS)
    transient_scale: float = 1.0  # × the unprofiled transient per step token (sim/memory.py)
    # (step tokens, factor on the linear layers' compute rate), interpolated in log tokens, flat outside:
    # a box whose GEMMs fill the GPU differently at small or large steps than a scalar can say.
    efficiency_by_tokens: tuple[tuple[int, float], ...] = ()

    def compute_factor(self, tokens: int) -> float:
        """The compute-rate factor at a step of `tokens` tokens (the table's, times the scalar)."""
        table = self.efficiency_by_tokens
        if not table:
            return self.compute_efficiency
        if tokens <= table[0][0]:
            factor = table[0][1]
        elif tokens >= table[-1][0]:
            factor = table[-1][1]
        else:
            x = math.log(tokens)
            factor = table[-1][1]
            for (t0, f0), (t1, f1) in itertools.pairwise(table):
                if tokens <= t1:
                    w = (x - math.log(t0)) / (math.log(t1) - math.log(t0))
                    factor = f0 + w * (f1 - f0)
                    break
        return self.compute_efficiency * factor


NO_DEVIATION = BoxDeviation()


@dataclass(frozen=True)
class GpuSpec:
    name: str  # a preset key or the file's `name`
    product_name: str  # what nvmlDeviceGetName says
    memory_gib: float
    bandwidth_gbps: float  # HBM/GDDR, GB/s
    fp16_tflops: float  # dense fp16 tensor throughput with fp32 accumulate
    pcie_gbps: float  # effective host<->device bandwidth (pinned), GB/s
    nvlink_gbps: float  # GPU<->GPU bandwidth over NVLink; 0 when the GPUs only share PCIe
    deviation: BoxDeviation = field(default=NO_DEVIATION)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def preset(self) -> GpuSpec | None:
        """The preset of the same product (what NVML's name says this card is), or None."""
        return next((g for g in GPU_PRESETS.values() if g.product_name == self.product_name), None)

    @property
    def link_gbps(self) -> float:
        """Bandwidth of the all-reduce path between GPUs."""
        return self.nvlink_gbps if self.nvlink_gbps > 0 else self.pcie_gbps


GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("rtx-3090", "NVIDIA GeForce RTX 3090", 23.69, 936.0, 71.0, 24.0, 0.0),
        GpuSpec("rtx-4090", "NVIDIA GeForce RTX 4090", 23.99, 1008.0, 165.0, 24.0, 0.0),
        # RTX 5090: 31.37 GiB as vLLM logs its total (vllm#14452), 1792 GB/s, 209.5 TFLOP/s dense fp16
        # with fp32 accumulate (GeForce cards run that at half their fp16-accumulate rate).
        GpuSpec("rtx-5090", "NVIDIA GeForce RTX 5090", 31.37, 1792.0, 209.5, 50.0, 0.0),
        # A100 40GB: 39.50 GiB as vLLM logs its total (vllm#12330).
        GpuSpec("a100-40gb", "NVIDIA A100-SXM4-40GB", 39.50, 1555.0, 312.0, 24.0, 600.0),
        GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", 79.25, 2039.0, 312.0, 24.0, 600.0),
        GpuSpec("h100-80gb", "NVIDIA H100 80GB HBM3", 79.65, 3350.0, 990.0, 50.0, 900.0),
    )
}

_FILE_FIELDS = ("name", "memory_gib", "bandwidth_gbps", "fp16_tflops", "pcie_gbps", "nvlink_gbps")
_Positive = Annotated[float, Field(gt=0, lt=1e7, allow_inf_nan=False, strict=False)]
_Factor = Annotated[float, Field(gt=0, le=4, allow_inf_nan=False, strict=True)]
_NUMBERS = ("memory_gib", "bandwidth_gbps", "fp16_tflops", "pcie_gbps", "nvlink_gbps", "compute_efficiency",
            "bandwidth_efficiency", "step_overhead_s", "non_torch_gib", "transient_scale")


class GpuFile(BaseModel):
    """A GPU description file, validated at the boundary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    product_name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    memory_gib: _Positive
    bandwidth_gbps: _Positive
    fp16_tflops: _Positive
    pcie_gbps: _Positive
    nvlink_gbps: Annotated[float, Field(ge=0, lt=1e7, allow_inf_nan=False)]
    # How this box deviates from its preset (BoxDeviation); all optional.
    compute_efficiency: Annotated[float, Field(gt=0, le=4, allow_inf_nan=False)] = 1.0
    bandwidth_efficiency: Annotated[float, Field(gt=0, le=4, allow_inf_nan=False)] = 1.0
    step_overhead_s: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    non_torch_gib: Annotated[float, Field(ge=0, le=1024, allow_inf_nan=False)] = 0.0
    transient_scale: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 1.0
    efficiency_by_tokens: list[tuple[Annotated[int, Field(ge=1, le=10_000_000, strict=True)], _Factor]] = \
        Field(default_factory=list, max_length=64)

    @field_validator(*_NUMBERS, mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {value!r}"[:120])
        return value

    @field_validator("efficiency_by_tokens")
    @classmethod
    def _ascending(cls, value: list[tuple[int, float]]) -> list[tuple[int, float]]:
        tokens = [t for t, _ in value]
        if tokens != sorted(set(tokens)):
            raise ValueError("needs [tokens, factor] pairs with tokens strictly ascending, e.g. "
                             "[[16, 0.8], [512, 1.0], [8192, 0.9]]")
        return value

    def deviation(self) -> BoxDeviation:
        return BoxDeviation(self.compute_efficiency, self.bandwidth_efficiency, self.step_overhead_s,
                            self.non_torch_gib, self.transient_scale,
                            tuple((int(t), float(f)) for t, f in self.efficiency_by_tokens))


def load_gpu(name_or_path: str) -> GpuSpec:
    """A preset name, or a YAML file with `name, memory_gib, bandwidth_gbps, fp16_tflops, pcie_gbps,
    nvlink_gbps` (and optionally `product_name` and the BoxDeviation fields)."""
    if name_or_path in GPU_PRESETS:
        return GPU_PRESETS[name_or_path]
    path = Path(name_or_path)
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name no file system accepts (NUL, too long)
        found = False
    if not found:
        raise HardwareSpecError(
            f"--sim-gpu {name_or_path!r} is neither a GPU preset ({', '.join(GPU_PRESETS)}) "
            "nor a readable YAML file"
        )
    data, node = compose_yaml(read_text(path, HardwareSpecError, "GPU description"), path, HardwareSpecError)
    if not isinstance(data, dict):
        raise HardwareSpecError(f"{path}:1: (top level): expected a mapping with keys {', '.join(_FILE_FIELDS)} "
                                "(and optionally product_name)")
    try:
        gpu = GpuFile.model_validate(data)
    except ValidationError as exc:
        raise HardwareSpecError(first_error(exc, path, lambda loc: line_of(node, loc))) from None
    return GpuSpec(gpu.name, gpu.product_name or gpu.name, gpu.memory_gib, gpu.bandwidth_gbps, gpu.fp16_tflops,
                   gpu.pcie_gbps, gpu.nvlink_gbps, gpu.deviation())
