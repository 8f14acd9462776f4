"""``CpuStandIn``: the dry run's device, which holds simulated GPU memory by formula and measures nothing."""

from __future__ import annotations

import os
import time
from typing import Any

from tools.gpu_check.config import GIB, MIB
from tools.gpu_check.device import DeviceOutOfMemoryError
from tools.gpu_check.prefill import Chunk


class CpuStandIn:
    """Stands in for TorchCuda in --dry-run: holds *simulated* GPU memory (a holder file on the
    simulator's GPU, which autotuner.sim.nvml reports) by formula, like a caching allocator would.
    It measures nothing; its figures only carry the plumbing through to the summary."""

    label = "CpuStandIn (dry run: figures are a formula, not a measurement)"
    CONTEXT_BYTES = 500 * MIB

    def __init__(self, index: int) -> None:
        import psutil

        from autotuner.sim.gpu_state import GpuHost, state_dir_from_env

        self.index = index
        self.state_dir = state_dir_from_env()
        gpus = GpuHost(self.state_dir).inventory()
        if not 0 <= index < len(gpus):
            raise RuntimeError(f"no simulated GPU {index} in {self.state_dir}")
        self.total = gpus[index].memory_total_bytes
        self.create_time = psutil.Process().create_time()
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.spec: Any = None
        self.kv_tokens = 0
        self._write()

    def _write(self) -> None:
        from autotuner.sim.gpu_state import write_holder

        write_holder(self.state_dir, gpu=self.index, pid=os.getpid(), create_time=self.create_time,
                     nbytes=self.CONTEXT_BYTES + self.reserved, name="gpu_check CpuStandIn")

    def _alloc(self, nbytes: int) -> None:
        if self.allocated + nbytes > self.reserved:
            want = -(-(self.allocated + nbytes) // (2 * MIB)) * 2 * MIB
            if self.CONTEXT_BYTES + want > self.total:
                free = self.total - self.CONTEXT_BYTES - self.reserved
                raise DeviceOutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB. GPU {self.index} has a total "
                    f"capacity of {self.total / GIB:.2f} GiB of which {max(0, free) / MIB:.2f} MiB is free. "
                    "(CpuStandIn)"
                )
            self.reserved = want
            self._write()
        self.allocated += nbytes
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.max_reserved = max(self.max_reserved, self.reserved)

    def _free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def hold(self, nbytes: int) -> None:
        self._alloc(nbytes)

    def release_all(self) -> None:
        self.allocated = 0
        self.empty_cache()

    def free_bytes(self) -> tuple[int, int]:
        return self.total - self.CONTEXT_BYTES - self.reserved, self.total

    def oom_error_type(self) -> type[BaseException]:
        return DeviceOutOfMemoryError

    def versions(self) -> dict[str, str]:
        return {"stand_in": self.label}

    def memory(self) -> tuple[int, int]:
        return self.allocated, self.reserved

    def reset_peak(self) -> None:
        self.max_allocated, self.max_reserved = self.allocated, self.reserved

    def peak(self) -> tuple[int, int]:
        return self.max_allocated, self.max_reserved

    def empty_cache(self) -> None:
        self.reserved = -(-self.allocated // (2 * MIB)) * 2 * MIB
        self._write()

    def load_model(self, spec: Any, layers: int | None) -> int:
        self.spec = spec
        n_layers = layers or spec.num_layers
        weights = spec.weight_bytes - (spec.num_layers - n_layers) * spec.params_per_layer * spec.dtype_bytes
        self._alloc(weights)
        return weights

    def reserve_kv(self, nbytes: int) -> int:
        per_token = self.spec.kv_bytes_per_token(1)
        self.kv_tokens = max(0, nbytes // per_token)
        self._alloc(self.kv_tokens * per_token)
        return self.kv_tokens

    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> None:
        m = self.spec
        for chunks in steps:
            tokens = sum(n for _, _, n in chunks)
            linear = tokens * m.dtype_bytes * (4 * m.hidden_size + 3 * m.intermediate_size)
            self._alloc(linear)
            for _, start, n in chunks:
                scores = 3 * m.num_heads * n * (start + n) * m.dtype_bytes if backend == "math" else 0
                self._alloc(scores)
                self._free(scores)
            self._free(linear)
        time.sleep(0.05)  # long enough for a 200 Hz sampler to see the reserved pool

    def attention_agreement(self) -> float:
        return 0.0
