"""Weight offload as one search axis: a mode (none | uva | prefetch) and the GiB per GPU it frees.

The sampler and the memory model see "GiB freed" whatever the backend; this module turns a (mode,
GiB) pair into vLLM's flags and back. UVA frees exactly `--cpu-offload-gb`. Prefetch frees whole
layers: the last K of every G (vLLM's grouping), less the static GPU buffers of the S layers in
flight, so a GiB target becomes the smallest layer plan that frees at least that much, spread as
evenly as vLLM's grouping allows (K = 1 where it can: the most compute between two copies). S stays 1:
vLLM's default, and the simulator gives more buffers no speed (their memory is the only effect we
can put figures on). Every plan has 1 ≤ K ≤ G and S ≥ 1, so it passes vLLM's OffloadConfig checks by
construction, and it never sets `--cpu-offload-gb` beside the prefetch flags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotuner.vllm import FlagValue

MODE = "offload-mode"
FREED = "offload-gib"
MODES = ("none", "uva", "prefetch")
UVA_FLAG = "cpu-offload-gb"
BACKEND_FLAG = "offload-backend"
GROUP_FLAG = "offload-group-size"
IN_GROUP_FLAG = "offload-num-in-group"
STEP_FLAG = "offload-prefetch-step"
PREFETCH_STEP = 1
GIB = 1 << 30


@dataclass(frozen=True)
class LayerShape:
    """What a prefetch plan needs of the model: decoder layers and one layer's GiB on one GPU."""

    num_layers: int
    layer_gib: float


@dataclass(frozen=True)
class PrefetchPlan:
    group_size: int
    num_in_group: int
    prefetch_step: int = PREFETCH_STEP

    def offloaded_layers(self, num_layers: int) -> int:
        """vLLM offloads layer i when i % G >= G - K."""
        full, rest = divmod(num_layers, self.group_size)
        return full * self.num_in_group + max(0, rest - (self.group_size - self.num_in_group))

    def freed_gib(self, shape: LayerShape) -> float:
        n = self.offloaded_layers(shape.num_layers)
        return max(0, n - min(self.prefetch_step, n)) * shape.layer_gib

    def flags(self) -> dict[str, FlagValue]:
        return {BACKEND_FLAG: "prefetch", GROUP_FLAG: self.group_size, IN_GROUP_FLAG: self.num_in_group,
                STEP_FLAG: self.prefetch_step}


def prefetch_plan(gib: float, shape: LayerShape) -> PrefetchPlan:
    """The plan freeing at least `gib` with the fewest offloaded layers (ties: the smallest K, i.e. the
    most even spread); every layer offloaded when nothing less frees enough."""
    need = math.ceil(gib / shape.layer_gib - 1e-9) + PREFETCH_STEP if shape.layer_gib > 0 else shape.num_layers
    best: tuple[int, int, PrefetchPlan] | None = None
    for group in range(1, shape.num_layers + 1):
        for in_group in range(1, group + 1):
            plan = PrefetchPlan(group, in_group)
            n = plan.offloaded_layers(shape.num_layers)
            if n < need:
                continue
            key = (n, in_group, plan)
            if best is None or key[:2] < best[:2]:
                best = key
            break  # a larger K in this group only offloads more
    return best[2] if best is not None else PrefetchPlan(1, 1)


def to_flags(mode: str, gib: float, shape: LayerShape | None) -> dict[str, FlagValue]:
    """vLLM flags for a point of the axis; an unknown shape (hub model offline) cannot plan prefetch, so
    the space never offers it then."""
    if mode == "none" or gib <= 0:
        return {}
    if mode == "uva":
        return {UVA_FLAG: round(float(gib), 6)}
    if shape is None:
        raise ValueError("prefetch offload needs the model's layer count and size")
    return prefetch_plan(gib, shape).flags()


def from_flags(flags: Mapping[str, FlagValue], shape: LayerShape | None) -> tuple[str, float]:
    """(mode, GiB freed per GPU) of a flag set, as vLLM would run it (`auto` picks prefetch when G > 0)."""
    group = _int(flags.get(GROUP_FLAG))
    backend = str(flags.get(BACKEND_FLAG) or "auto")
    if (backend == "prefetch" or (backend == "auto" and group > 0)) and group > 0:
        plan = PrefetchPlan(group, _int(flags.get(IN_GROUP_FLAG), 1), _int(flags.get(STEP_FLAG), PREFETCH_STEP))
        return "prefetch", plan.freed_gib(shape) if shape is not None else 0.0
    uva = flags.get(UVA_FLAG)
    gib = float(uva) if isinstance(uva, int | float | str) and not isinstance(uva, bool) and uva != "" else 0.0
    if backend in ("auto", "uva") and gib > 0:
        return "uva", gib
    return "none", 0.0


def freed_gib(flags: Mapping[str, FlagValue], shape: LayerShape | None) -> float:
    return from_flags(flags, shape)[1]


def _int(value: FlagValue | None, default: int = 0) -> int:
    if value is None or isinstance(value, list | bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def layer_shape(model: str) -> LayerShape | None:
    """From a simulator preset or a local config.json (the TP split is applied by `per_gpu`)."""
    from autotuner.catalog.models import load_model
    from autotuner.errors import ModelSpecError

    try:
        spec = load_model(model)
    except ModelSpecError:
        return None
    return LayerShape(spec.num_layers, spec.params_per_layer * spec.dtype_bytes / GIB)


def per_gpu(shape: LayerShape | None, tensor_parallel_size: int) -> LayerShape | None:
    return None if shape is None else LayerShape(shape.num_layers, shape.layer_gib / max(1, tensor_parallel_size))
