"""The machine: GPUs through the memory monitor, the storage, the log directory's disk, host RAM."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.preflight.checklist import Check
from autotuner.scenario import Scenario
from autotuner.vllm import Platform

GIB = 1 << 30
MIN_LOG_FREE_BYTES = 1 * GIB  # engine logs of a night of trials, with room to spare
_FIX_NVML = ("run on a machine whose NVIDIA driver works (`nvidia-smi` lists the GPUs) with nvidia-ml-py "
             "installed; for a CPU engine use monitor.kind: host, or engine.kind: sim to try the simulator")


def check_gpus(scenario: Scenario) -> tuple[Check, Platform | None]:
    """Open the scenario's monitor as a trial would, read every device once, and show the GPUs it
    watches (the ones trials run on); fail when the scenario's TP × PP needs more of them."""
    from autotuner.monitor import busy_devices

    if not backend_for(scenario).uses_box_gpus:  # virtual time: the GPUs are a model
        from autotuner.catalog.gpus import load_gpu

        try:
            gpu = load_gpu(scenario.sim_gpu())
        except UserInputError as exc:
            return Check("GPUs", "failed", f"engine.sim.gpu: {exc}", "name a GPU preset or a GPU YAML file"), None
        count = scenario.sim_gpu_count()
        return Check("GPUs", "ok", f"{count} × {gpu.product_name} (simulated, virtual time)"), \
            Platform(gpu.product_name, gpu.memory_gib, count)
    backend = backend_for(scenario)
    kind = backend.monitor_kind(scenario.monitor.kind)
    try:
        monitor = backend.monitor(scenario)
    except UserInputError as exc:
        fix = _FIX_NVML if "NVML" in str(exc) or "nvml" in str(exc) else "pick GPUs this machine has in engine.gpus"
        return Check("GPUs", "failed", f"monitor.kind {scenario.monitor.kind}: {exc}", fix), None
    except Exception as exc:
        return Check("GPUs", "failed", f"the memory monitor did not start: {type(exc).__name__}: {exc}",
                     _FIX_NVML), None
    try:
        devices = monitor.devices()
        used = monitor.sample()
        busy = busy_devices(monitor)
    except Exception as exc:
        return Check("GPUs", "failed", f"reading memory failed: {type(exc).__name__}: {exc}", _FIX_NVML), None
    finally:
        monitor.close()
    host = bool(devices) and devices[0].uuid.startswith("host-")
    world = _world_size(scenario)
    if host:
        return _host_row(scenario, kind, world), Platform("cpu", 0.0)
    platform = Platform(devices[0].name, round(devices[0].total_bytes / GIB, 2), len(devices)) if devices else None
    shown = f"monitor {'nvml' if kind == 'auto' else kind}: " + "; ".join(_describe(devices, used))
    if world > len(devices):
        chosen = f"engine.gpus {scenario.engine.gpus}" if scenario.engine.gpus is not None else "all it sees"
        return Check("GPUs", "failed", f"{shown}. tensor-parallel-size × pipeline-parallel-size is {world}, but "
                     f"the monitor watches {len(devices)} GPU{'s' if len(devices) != 1 else ''} ({chosen}): "
                     "every trial would fail to start",
                     f"list {world} GPUs in engine.gpus (or leave it out to use all), or lower "
                     "engine.flags.tensor-parallel-size"), platform
    if busy:
        held = "; ".join(f"GPU {i}: " + ", ".join(f"pid {p} holds {b / GIB:.1f} GiB" for p, b in procs)
                         for i, procs in sorted(busy.items()))
        return Check("GPUs", "warning", f"{shown}. Foreign memory: {held}",
                     "stop those processes or pick other GPUs with engine.gpus (trials wait for free GPUs)"), platform
    return Check("GPUs", "ok", shown), platform


def _world_size(scenario: Scenario) -> int:
    pp = scenario.engine.flags.get("pipeline-parallel-size", 1)
    return scenario.tensor_parallel_size() * (int(pp) if isinstance(pp, int) and not isinstance(pp, bool) else 1)


def _host_row(scenario: Scenario, kind: str, world: int) -> Check:
    """The monitor watches host memory: say why, and what the box's NVML (the inventory init lists)
    sees instead; a TP above 1 cannot run on host memory."""
    from autotuner.monitor import NvmlUnavailableError
    from autotuner.watch.inventory import gpu_inventory

    why = "monitor.kind host" if kind == "host" else "monitor.kind auto found no NVML"
    if kind != "host":
        try:
            gpu_inventory("nvml")
        except NvmlUnavailableError as exc:
            why += f" ({exc})"
        except Exception as exc:  # a broken driver: the reason is still worth showing
            why += f" ({type(exc).__name__}: {exc})"
    try:
        seen = gpu_inventory()  # what `autotuner init` lists: real NVML, else a simulated box
    except Exception:
        seen = ()
    detail = f"no GPU: the monitor watches host memory ({why})"
    fix = None
    if seen:
        simulated = os.environ.get("AUTOTUNER_SIM_STATE_DIR")
        source = f"the simulator's NVML ($AUTOTUNER_SIM_STATE_DIR={simulated})" if simulated else "NVML"
        kinds: dict[str, list[int]] = {}
        for g in seen:
            kinds.setdefault(f"{g.name} ({g.memory_total_mib / 1024:.1f} GiB)", []).append(g.index)
        detail += f"; {source} lists {len(seen)} GPU{'s' if len(seen) != 1 else ''}: " + ", ".join(
            f"{_span(idx)} {name}" for name, idx in kinds.items())
        fix = ("set monitor.kind: sim to watch the simulated GPUs" if simulated else
               "set monitor.kind: nvml (install nvidia-ml-py) to watch them") + \
            ", and engine.gpus to the ones production's engine uses"
    if world > 1:
        return Check("GPUs", "failed", f"{detail}. tensor-parallel-size × pipeline-parallel-size is {world}: an "
                     "engine on that many GPUs cannot be watched through host memory, and its peaks would go "
                     "unseen", fix or _FIX_NVML)
    if seen:
        return Check("GPUs", "warning", detail, fix)
    return Check("GPUs", "ok", detail)


def _indices(devices: list) -> str:  # type: ignore[type-arg]
    return _span([d.index for d in devices])


def _span(idx: list[int]) -> str:
    """`0-7` for a contiguous run, else `0,2,5`."""
    if len(idx) > 1 and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"{idx[0]}-{idx[-1]}"
    return ",".join(map(str, idx))


def _describe(devices: list, used: list[int]) -> list[str]:  # type: ignore[type-arg]
    """`GPUs 0-7: 8 × NVIDIA GeForce RTX 3090 (23.7 GiB), 0.0 GiB in use on each` or one part per GPU."""
    if not devices:
        return ["no device"]
    kinds = {(d.name, d.total_bytes) for d in devices}
    if len(kinds) == 1 and len(set(used)) == 1:
        d = devices[0]
        noun = "GPUs" if len(devices) > 1 else "GPU"
        return [f"{noun} {_indices(devices)}: {len(devices)} × {d.name} ({d.total_bytes / GIB:.1f} GiB), "
                f"{used[0] / GIB:.1f} GiB in use on " + ("each" if len(devices) > 1 else "it")]
    return [f"GPU {d.index} {d.name} {u / GIB:.1f}/{d.total_bytes / GIB:.1f} GiB in use"
            for d, u in zip(devices, used, strict=True)]


def check_storage(url: str) -> Check:
    """Reachable and writable, without creating anything."""
    from sqlalchemy.engine import make_url

    from autotuner.store.db import Store, sqlalchemy_url

    try:
        full = sqlalchemy_url(url)
        shown = make_url(full).render_as_string(hide_password=True)
    except Exception as exc:
        return Check("storage", "failed", f"storage {url!r} is not a SQLite path or SQLAlchemy URL: {exc}",
                     "use a path like out/autotuner.db or postgresql://user@host/db")
    if full.startswith("sqlite:///"):
        path = Path(full.removeprefix("sqlite:///"))
        if not path.parent.is_dir():
            return Check("storage", "failed", f"storage {shown}: directory {path.parent} does not exist",
                         f"create it (mkdir -p {path.parent}) or point --storage elsewhere")
        target = path if path.exists() else path.parent
        if not os.access(target, os.W_OK):
            return Check("storage", "failed", f"storage {shown}: {target} is not writable",
                         "fix its permissions or point --storage elsewhere")
        return Check("storage", "ok", f"{shown} ({'exists' if path.exists() else 'will be created'})")
    try:
        Store(full, create=False).engine.dispose()
    except UserInputError as exc:
        return Check("storage", "failed", str(exc), "check the URL, the server and the credentials")
    return Check("storage", "ok", f"{shown} reachable")


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_log_dir(log_dir: Path) -> Check:
    base = _existing_ancestor(log_dir)
    if not os.access(base, os.W_OK):
        return Check("log directory", "failed", f"{log_dir}: {base} is not writable",
                     "pass --log-dir to a writable directory, or set AUTOTUNER_HOME")
    free = shutil.disk_usage(base).free
    if free < MIN_LOG_FREE_BYTES:
        return Check("log directory", "warning", f"{log_dir}: only {free / GIB:.2f} GiB free on its disk",
                     "free some space or pass --log-dir on another disk")
    return Check("log directory", "ok", f"{log_dir} ({free / GIB:.0f} GiB free)")


def check_host_ram(scenario: Scenario) -> Check:
    """vLLM pins TP × cpu-offload-gb GiB of host RAM; the range searched must fit the host."""
    if not backend_for(scenario).checks_host_ram:
        return Check("host RAM", "ok", "simulated host")
    tp = scenario.tensor_parallel_size()
    total = psutil.virtual_memory().total
    fixed = scenario.engine.flags.get("cpu-offload-gb")
    space = scenario.search_space or {}
    param = space.get("cpu-offload-gb") or space.get("cpu_offload_gb")
    high = None
    if isinstance(fixed, int | float) and not isinstance(fixed, bool):
        high = float(fixed)
    elif param is not None and param.high not in (None, "auto"):
        high = float(param.high)  # type: ignore[arg-type]
    if high is None:
        return Check("host RAM", "ok", f"{total / GIB:.0f} GiB (the offload range follows it)")
    need = high * tp * GIB
    if need > total:
        return Check("host RAM", "failed", f"cpu-offload-gb up to {high:g} GiB × TP {tp} pins {need / GIB:.0f} GiB "
                     f"of host RAM, the host has {total / GIB:.0f} GiB",
                     "lower cpu-offload-gb (or its search_space high), or use high: auto")
    return Check("host RAM", "ok", f"{total / GIB:.0f} GiB covers cpu-offload-gb up to {high:g} × TP {tp}")
