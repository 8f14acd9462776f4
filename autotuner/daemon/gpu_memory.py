"""Production's GPUs as NVML shows them: the memory free for a restart, and other processes' memory beside
production's (what a fleet box compares before adopting a winner tuned on another box)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import structlog

from autotuner.daemon.keeper import FreeMemory
from autotuner.proc_identity import listening_tree
from autotuner.vllm import defaults
from autotuner.vllm.flags import UTILIZATION
from autotuner.watch.inventory import MIB, gpu_holders, gpu_used_bytes

log = structlog.get_logger(__name__)


def production_free(wanted: Sequence[int] | None) -> FreeMemory | None:
    """The smallest free memory over production's GPUs (all of the box's unless production.gpus says)."""
    try:
        gpus = gpu_used_bytes()
    except Exception as exc:  # no NVML: nothing to fit to
        log.debug("daemon.no_gpu_memory", error=str(exc))
        return None
    rows = [(g, used) for g, used in gpus if wanted is None or g.index in wanted]
    if not rows:
        return None
    g, used = min(rows, key=lambda r: r[0].memory_total_mib * MIB - r[1])
    total = g.memory_total_mib * MIB
    return FreeMemory(total, max(0, total - used))


def production_foreign(endpoint: str, wanted: Sequence[int] | None, live: dict[str, Any] | None,
                       serving: bool) -> int | None:
    """Other processes' memory on production's GPUs (the most on one); None without NVML. Production's own
    processes are the one listening on its endpoint's port and its descendants."""
    try:
        gpus = gpu_holders()
    except Exception:  # no NVML: nothing to compare
        return None
    port = urlsplit(endpoint).port
    production = {p.pid for p in listening_tree(port)} if port else set()
    rows = [(g.memory_total_mib * MIB, used, sum(n for pid, n in held if pid in production))
            for g, used, held in gpus if wanted is None or g.index in wanted]
    return foreign_bytes(rows, live, serving)


def foreign_bytes(gpus: list[tuple[int, int, int]], live: dict[str, Any] | None, serving: bool) -> int | None:
    """Other processes' memory on production's GPUs, the most on one, from (total, used, production's) per
    GPU, production's being what NVML lists for its processes. Where those hold nothing (not found: a
    remote endpoint, a container's proxy listening), production is taken to hold its budget (vLLM sizes its
    cache so that it holds utilization x total): an estimate off by what it keeps outside that budget, CUDA
    graphs and the transient (~0.2 to 1.2 GiB for the simulated 8B model). While production is down, all
    used memory is others'. None without GPU figures. Production's processes found holding memory count as
    production's whatever `serving` says (the health task may not have seen a restart end yet)."""
    if not gpus:
        return None
    util = float((live or {}).get(UTILIZATION, defaults.GPU_MEMORY_UTILIZATION))
    others = [used - ours if ours else used - int(util * total) if serving else used for total, used, ours in gpus]
    return max(0, *others)
