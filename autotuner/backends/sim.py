"""The simulated backends: `sim` (the simulated vLLM as a process, on the simulator's GPUs) and
`sim-virtual` (its engine core evaluated in this process, in virtual time; no process, no GPU).

`sim_argv` is the one place the simulator's `--sim-*` arguments are built, for its process, its
evaluator and a config read. The simulator (autotuner.sim.*) is imported inside methods only, so that
importing this package (the CLI's start) does not load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from autotuner.backends.base import Backend
from autotuner.vllm import flag_argv

if TYPE_CHECKING:
    from autotuner.monitor.factory import MonitorKind
    from autotuner.scenario import Scenario
    from autotuner.vllm import FlagValue

SIMULATED_HOST_BYTES = 256 << 30  # the simulated box's host RAM


def sim_argv(scenario: Scenario, *, speedup: bool = False, noise: bool = True, run: int | None = None,
             box_gpus: bool = False) -> list[str]:
    """The simulator's arguments for the scenario's box: `speedup` for a process (wall-clock pacing),
    `noise` (seed and level) for a measurement, `run` to pick the noise draw, `box_gpus` to name the
    box's GPU count even when engine.sim.gpus leaves it to the TP size."""
    sim = scenario.engine.sim
    argv = ["--sim-gpu", scenario.sim_gpu()]
    if speedup:
        argv += ["--sim-speedup", str(sim.speedup)]
    if noise:
        argv += ["--sim-seed", str(sim.seed), "--sim-noise", str(sim.noise)]
    if run is not None:
        argv += ["--sim-run", str(run)]
    if box_gpus:
        argv += ["--sim-gpus", str(scenario.sim_gpu_count())]
    elif sim.gpus is not None:
        argv += ["--sim-gpus", str(sim.gpus)]
    return argv


class _Simulated(Backend):
    """What both simulated kinds share: the preset model and GPU, the simulated host."""

    accepts_unknown_flags = False
    checks_host_ram = False
    simulated_host_bytes = SIMULATED_HOST_BYTES
    version_note = "simulated"

    def default_limits(self, scenario: Scenario, flags: Mapping[str, FlagValue]) -> tuple[object, object]:
        from autotuner.sim.args import VllmArgError, build_config, parse_args

        try:
            config = build_config(parse_args([scenario.engine.model, *flag_argv(flags),
                                              *sim_argv(scenario, noise=False, box_gpus=True)]),
                                  scenario.engine.env)
        except VllmArgError:
            return None, None
        return config.max_model_len, config.max_num_seqs

    def engine_version(self, scenario: Scenario) -> str:
        from autotuner.sim.args import VLLM_VERSION

        return f"{VLLM_VERSION} ({self.version_note})"

    def gpu_inventory(self, scenario: Scenario) -> list[str]:
        from autotuner.catalog.gpus import load_gpu

        gpu = load_gpu(scenario.sim_gpu())
        return [f"{gpu.product_name} ({gpu.memory_gib} GiB, simulated)"] * scenario.sim_gpu_count()

    def model_fingerprint(self, scenario: Scenario) -> str:
        """The preset's (or config.json's) shape."""
        from autotuner.catalog.models import load_model

        return load_model(scenario.engine.model).fingerprint()


class SimBackend(_Simulated):
    """The simulated vLLM as a process, watched through the simulator's NVML."""

    runs_process = True
    uses_box_gpus = True

    def monitor_kind(self, configured: MonitorKind) -> MonitorKind:
        return "sim" if configured == "auto" else configured  # the simulator's NVML (a monitor kind)

    def prepare_gpus(self, scenario: Scenario) -> None:
        """The simulated box exists before its first engine starts, so it can be watched (and checked for
        busy GPUs) like a real one."""
        from autotuner.catalog.gpus import load_gpu
        from autotuner.engine.gpu_locks import GpusBusyError
        from autotuner.sim.gpu_state import GpuHost, GpuInventoryConflict, make_gpus, state_dir_from_env

        gpu = load_gpu(scenario.sim_gpu())
        state = state_dir_from_env()
        try:
            GpuHost(state).ensure_inventory(make_gpus(state, gpu.product_name, gpu.memory_bytes,
                                                      scenario.sim_gpu_count()))
        except GpuInventoryConflict as exc:
            raise GpusBusyError(f"simulated GPUs in {state}: {exc}") from None

    def box_gpu_indices(self, scenario: Scenario) -> list[int] | None:
        return list(range(scenario.sim_gpu_count()))

    def argv_extras(self, scenario: Scenario, run: int | None = None) -> list[str]:
        return sim_argv(scenario, speedup=True, run=run)


class VirtualBackend(_Simulated):
    """The simulator's engine core in virtual time: no process, no GPU of ours."""

    runs_process = False
    uses_box_gpus = False
    version_note = "simulated, virtual time"

    def argv_extras(self, scenario: Scenario, run: int | None = None) -> list[str]:
        return sim_argv(scenario, run=run)
