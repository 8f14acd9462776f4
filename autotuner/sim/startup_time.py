"""How long a simulated `vllm serve` takes to come up, phase by phase, and the caches that make the
next start faster.

A real start of vLLM 0.32 goes through (field reports; ../shared/notes/anchors.md "Restart cost"):

- the API server's imports and argument handling, then CUDA/NCCL initialisation of the workers;
- the P2P access check that gates the custom all-reduce: vLLM tests every ordered GPU pair once in a
  subprocess and caches the answer (`~/.cache/vllm/gpu_p2p_access_cache_for_<devices>.json`). It runs
  only where the custom all-reduce can be used: two PCIe GPUs or NVLink; with more than two PCIe-only
  GPUs vLLM disables the custom all-reduce before the check (custom_all_reduce.py, facts note §4);
- loading the weights: from the OS page cache when the files were read recently, else from disk;
- torch.compile (Dynamo + Inductor), whose artefacts vLLM caches (`~/.cache/vllm/torch_compile_cache`,
  under a hash of the model, parallel and compilation configs). The graph is compiled for dynamic token
  counts, so a new token budget alone is taken to reuse the cache (not verified against vLLM's hash);
  a new model, TP size or --enforce-eager does not;
- the profiling run (memory), then CUDA-graph capture (never cached).

Each constant says where it comes from. The caches live in the simulated host's state directory
(`startup-caches.json`), so a second `sim serve` of the same model on the same GPUs starts warm, the way
a second `vllm serve` on a real box does; `autotuner sim` never clears them (a real reboot would clear the
page cache; nothing here models reboots).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from autotuner.filelocks import exclusive
from autotuner.sim.args import EngineConfig

# `vllm serve` from the shell prompt to the engine's first log line: Python imports (torch, vllm,
# transformers) and argument parsing. vllm#19824's H100 TP 8 timeline and the 88 s warm single-3090 start
# (anchors) leave ~10–15 s before the engine starts; 12 s, an estimate within that.
API_SERVER_START_S = 12.0
# CUDA contexts, NCCL communicator set-up, worker processes: the simulator's former INIT_S (est.).
INIT_TP_S = 6.0
INIT_SINGLE_S = 3.0
# P2P check: ~60 s at TP 8 on H100 the first time, cached after (vllm#19824); TP 8 tests 8 × 7 = 56 ordered
# pairs, so ~1.07 s a pair.
P2P_CHECK_PER_PAIR_S = 60.0 / 56
# Weights: from the page cache, per rank in parallel (the simulator's former LOAD_GBPS: 3 GiB a rank at
# TP 8 in ~2 s; vllm#19824 logs ~10 s for a TP 8 H100 load from page cache of a larger model); from disk
# the ranks share one NVMe: the whole checkpoint at DISK_GBPS (est.: a PCIe 4.0 consumer NVMe reads
# safetensors at 2–3 GB/s; 2.0 leaves room for the small-file and mmap overheads).
PAGE_CACHE_GBPS = 1.5
DISK_GBPS = 2.0
# torch.compile: cold 68.5 s (vllm#32191), ~70 s at TP 8 on H100 (vllm#19824); from the compile cache
# 9.6 s on 2×3090 (anchors: "2×3090 compile from cache 9.6 s").
COMPILE_COLD_S = 68.5
COMPILE_WARM_S = 9.6
# The profiling run (one forward of the token budget plus the sampler): a few seconds (the simulator's
# former PROFILE_S, est.).
PROFILE_S = 2.0
# CUDA-graph capture, never cached: ~60 s at TP 8 on H100 (vllm#19824); 2×3090 "profile/warm-up 57 s"
# from a warm compile cache (anchors). 55 s with the profiling run beside it.
GRAPH_CAPTURE_S = 55.0

CACHE_FILE = "startup-caches.json"


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float  # simulated
    cached: bool  # whether a cache made it short (or skipped it)


@dataclass(frozen=True)
class StartupCaches:
    """What the simulated host remembers between engine starts (keys, see `_keys`)."""

    p2p: bool
    weights: bool
    compile: bool


def _keys(config: EngineConfig) -> dict[str, str]:
    gpus = ",".join(str(i) for i in config.gpu_indices)
    model = config.model.fingerprint()
    return {
        "p2p": f"{config.sim.gpu.product_name}|{gpus}",
        "weights": model,
        "compile": f"{model}|tp{config.tensor_parallel_size}|eager{config.enforce_eager}",
    }


def needs_p2p_check(config: EngineConfig) -> bool:
    tp = config.tensor_parallel_size
    return tp > 1 and (tp == 2 or config.sim.gpu.nvlink_gbps > 0)


def phases(config: EngineConfig, caches: StartupCaches, weights_bytes: int) -> list[Phase]:
    """The start's phases in simulated seconds, given what is cached. `weights_bytes`: per rank."""
    tp = config.tensor_parallel_size
    out = [Phase("api-server", API_SERVER_START_S, False),
           Phase("init", INIT_TP_S if tp > 1 else INIT_SINGLE_S, False)]
    if needs_p2p_check(config):
        out.append(Phase("p2p-check", 0.0 if caches.p2p else tp * (tp - 1) * P2P_CHECK_PER_PAIR_S, caches.p2p))
    load = weights_bytes / (PAGE_CACHE_GBPS * 1e9) if caches.weights else weights_bytes * tp / (DISK_GBPS * 1e9)
    out.append(Phase("load", load + 0.5, caches.weights))
    if not config.enforce_eager:
        out.append(Phase("compile", COMPILE_WARM_S if caches.compile else COMPILE_COLD_S, caches.compile))
    out.append(Phase("profile", PROFILE_S, False))
    if not config.enforce_eager:
        out.append(Phase("graphs", GRAPH_CAPTURE_S, False))
    return out


def _read(fd: int) -> dict[str, list[str]]:
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def lookup_and_remember(state_dir: Path, config: EngineConfig) -> StartupCaches:
    """What this start finds cached, and (the start warms them) remember its keys for the next one."""
    state_dir.mkdir(parents=True, exist_ok=True)
    keys = _keys(config)
    with exclusive(state_dir / CACHE_FILE) as fd:
        data = _read(fd)
        found = {kind: key in data.get(kind, []) for kind, key in keys.items()}
        for kind, key in keys.items():
            seen = [k for k in data.get(kind, []) if isinstance(k, str)]
            data[kind] = [*seen, key] if key not in seen else seen
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(data).encode())
    return StartupCaches(**found)
