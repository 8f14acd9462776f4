"""Simulated GPU kinds: presets and GPU description files.

The numbers are the facts note's (§5). `memory_gib` is what NVML reports as the card's total, which
for a "24 GB" RTX 3090 is 23.69 GiB, not 24.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from autotuner.errors import HardwareSpecError

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


def load_gpu(name_or_path: str) -> GpuSpec:
    """A preset name, or a YAML file with `name, memory_gib, bandwidth_gbps, fp16_tflops, pcie_gbps,
    nvlink_gbps` (and optionally `product_name`)."""
    if name_or_path in GPU_PRESETS:
        return GPU_PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise HardwareSpecError(
            f"--sim-gpu {name_or_path!r} is neither a GPU preset ({', '.join(GPU_PRESETS)}) "
            "nor a readable YAML file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HardwareSpecError(f"{path}: cannot read GPU description: {exc}") from exc
    if not isinstance(data, dict):
        raise HardwareSpecError(f"{path}: expected a mapping with keys {', '.join(_FILE_FIELDS)}")
    missing = [k for k in _FILE_FIELDS if k not in data]
    unknown = sorted(set(data) - set(_FILE_FIELDS) - {"product_name"})
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown {', '.join(unknown)}")
        raise HardwareSpecError(f"{path}: {'; '.join(parts)} (allowed: {', '.join(_FILE_FIELDS)})")
    numbers: dict[str, float] = {}
    for key in _FILE_FIELDS[1:]:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HardwareSpecError(f"{path}: {key} must be a number, got {value!r}")
        if value < 0 or (value == 0 and key != "nvlink_gbps"):
            raise HardwareSpecError(f"{path}: {key} must be positive, got {value!r}")
        numbers[key] = float(value)
    name = str(data["name"])
    return GpuSpec(name=name, product_name=str(data.get("product_name", name)), **numbers)
