"""Disjoint GPU groups: when one engine needs fewer GPUs than the box has (tensor × pipeline parallel <
GPUs), several trials run at once, each engine pinned to its own group with `CUDA_VISIBLE_DEVICES`,
watched by its own memory monitor and holding its own per-GPU locks.

GPU indices belong to a trial, not to the process: `plan_groups` splits the scenario's GPUs into
groups, `GroupSlots` hands a free group to each trial launched and remembers which trials ran side by
side (they share CPU, PCIe and host RAM: the noise a trial's user attributes name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario

if TYPE_CHECKING:
    import optuna

AUTO = "auto"
OFF = "off"
PARALLEL_FLAGS = ("tensor-parallel-size", "pipeline-parallel-size")


@dataclass(frozen=True)
class GpuGroup:
    """One trial's GPUs (NVML indices); `gpus` None: the scenario's own setting (one trial at a time)."""

    position: int
    gpus: tuple[int, ...] | None

    def label(self) -> str:
        return "-" if self.gpus is None else ",".join(map(str, self.gpus))


WHOLE_BOX = GpuGroup(0, None)


def parse_setting(text: str) -> str | int:
    """`--gpu-groups`: auto, off, or a number of groups."""
    value = text.strip().lower()
    if value in (AUTO, OFF):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise UserInputError(f"--gpu-groups {text!r}: expected auto, off or a number of groups ≥ 1 (e.g. 4)")


def gpus_per_trial(scenario: Scenario) -> int:
    """tensor × pipeline parallel, at the largest the search space allows (a group must fit every trial)."""
    size = 1
    space = scenario.search_space or {}
    for name in PARALLEL_FLAGS:
        fixed = scenario.engine.flags.get(name, 1)
        values = [fixed]
        param = space.get(name)
        if param is not None:
            values += [param.high] if param.high not in (None, "auto") else []
            values += list(param.choices or [])
        size *= max((int(v) for v in values if isinstance(v, int | float | str) and str(v).isdigit()), default=1)
    return max(size, 1)


def box_gpus(scenario: Scenario) -> list[int] | None:
    """The GPUs a study may use: engine.gpus, else every GPU of the (simulated) box; None where trials
    use no GPU of ours (virtual time, the host monitor)."""
    backend = backend_for(scenario)
    if not backend.uses_box_gpus or scenario.monitor.kind == "host":
        return None
    if scenario.engine.gpus is not None:
        return list(scenario.engine.gpus)
    known = backend.box_gpu_indices(scenario)
    if known is not None:
        return known
    from autotuner.monitor import HostMonitor

    with backend_for(scenario).monitor(scenario) as monitor:
        if isinstance(monitor, HostMonitor):
            return None
        return [d.index for d in monitor.devices()]


def plan_groups(scenario: Scenario, setting: str | int = AUTO, gpus: Sequence[int] | None = None) -> list[GpuGroup]:
    """Disjoint groups of the box's GPUs, one trial each. One group (the scenario as it is) when groups
    are off, when one trial needs every GPU, or where trials use no GPU of ours."""
    if setting == OFF:
        return [WHOLE_BOX]
    pool = list(gpus) if gpus is not None else box_gpus(scenario)
    size = gpus_per_trial(scenario)
    fit = 0 if pool is None else len(pool) // size
    if isinstance(setting, int) and setting > max(fit, 1):
        where = "no GPU of its own" if pool is None else f"{len(pool)} GPU(s)"
        raise UserInputError(f"--gpu-groups {setting}: a trial needs {size} GPU(s) (tensor × pipeline parallel) and "
                             f"the scenario has {where}, room for {max(fit, 1)} group(s); use --gpu-groups auto")
    count = fit if setting == AUTO else int(setting)
    if pool is None or count <= 1:
        return [WHOLE_BOX]
    return [GpuGroup(i, tuple(pool[i * size:(i + 1) * size])) for i in range(count)]


@dataclass
class GroupSlots:
    """Free groups, and which launched trials ran at the same time (each trial's neighbours)."""

    groups: list[GpuGroup]
    _free: list[GpuGroup] = field(init=False)
    _running: dict[int, set[int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._free = list(self.groups)

    @property
    def side_by_side(self) -> bool:
        return len(self.groups) > 1

    def free(self) -> int:
        return len(self._free)

    def take(self) -> GpuGroup:
        return self._free.pop(0)

    def give_back(self, group: GpuGroup) -> None:
        self._free.append(group)
        self._free.sort(key=lambda g: g.position)

    def launching(self, number: int) -> None:
        """Trial `number` starts an engine: it and every engine running now are neighbours."""
        for others in self._running.values():
            others.add(number)
        self._running[number] = set(self._running)

    def landed(self, number: int) -> list[int]:
        """Trial `number`'s engine is gone: the trials that ran beside it at any time."""
        return sorted(self._running.pop(number, set()))


def record_neighbours(trial: optuna.Trial, group: GpuGroup, slots: GroupSlots) -> None:
    """Noise the numbers carry: the trial's GPUs and the trials that ran beside it (sharing CPU, PCIe
    and host RAM), on the trial; confirmation re-measures alone."""
    neighbours = slots.landed(trial.number)
    if group.gpus is not None:
        trial.set_user_attr("gpu_group", list(group.gpus))
        trial.set_user_attr("neighbours", neighbours)
