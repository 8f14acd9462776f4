"""GPU kinds for the simulated box: presets and GPU description files (what a card is: its memory,
bandwidths and throughput; what the simulator makes of them is sim/roofline.py's).

The numbers are the facts note's (§5). `memory_gib` is what NVML reports as the card's total, which
for a "24 GB" RTX 3090 is 23.69 GiB, not 24.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotuner.errors import HardwareSpecError
from autotuner.filelines import compose_yaml, first_error, line_of, read_text

GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    name: str  # a preset key or the file's `name`
    product_name: str  # what nvmlDeviceGetName says
    memory_gib: float
    bandwidth_gbps: float  # HBM/GDDR, GB/s
    fp16_tflops: float  # dense fp16 tensor throughput with fp32 accumulate
    pcie_gbps: float  # effective host<->device bandwidth (pinned), GB/s
    nvlink_gbps: float  # GPU<->GPU bandwidth over NVLink; 0 when the GPUs only share PCIe

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

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

    @field_validator("memory_gib", "bandwidth_gbps", "fp16_tflops", "pcie_gbps", "nvlink_gbps", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {value!r}"[:120])
        return value


def load_gpu(name_or_path: str) -> GpuSpec:
    """A preset name, or a YAML file with `name, memory_gib, bandwidth_gbps, fp16_tflops, pcie_gbps,
    nvlink_gbps` (and optionally `product_name`)."""
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
    numbers = gpu.model_dump(exclude={"name", "product_name"})
    return GpuSpec(name=gpu.name, product_name=gpu.product_name or gpu.name, **numbers)
