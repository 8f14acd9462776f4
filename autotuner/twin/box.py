"""What the twin simulates for a study: the study's model and workload on the preset of the GPUs the
study's key names, in virtual time, noise-free, with the fitted box parameters applied.

The GPU is found from the study key's inventory (the product name NVML or the simulator reported), never
from a box file: on a real box there is none, and a simulated box's file is the ground truth the twin is
judged against. Where no preset matches (an engine on the CPU, an unlisted card), the model is not one
the simulator can read (a hub name offline), or the workload is a trace, there is no twin and the tuner
searches as it always did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, Protocol

from autotuner.catalog.gpus import GPU_PRESETS, GpuSpec
from autotuner.catalog.models import load_model
from autotuner.errors import AutotunerError
from autotuner.scenario import Scenario, WorkloadSettings
from autotuner.sim.args import VllmArgError, build_config, parse_args
from autotuner.trials.result import TrialResult
from autotuner.twin.params import BoxParams
from autotuner.vllm import FlagValue, flag_argv

MEMO_SIZE = 20_000


class VirtualEngine(Protocol):
    """What the twin runs its predictions on: the tuner's `VirtualRunner` (the simulator's engine core in
    virtual time), handed in by the layer above so that the twin stays below the tuner."""

    gpu: GpuSpec | None

    def evaluate(self, flags: Mapping[str, FlagValue]) -> TrialResult: ...


EngineFactory = Callable[[Scenario], VirtualEngine]


@dataclass(frozen=True)
class TwinBox:
    """The twin's scenario (sim-virtual, the preset GPU, noise 0) and the preset it starts from."""

    scenario: Scenario
    preset: GpuSpec
    make_engine: EngineFactory
    # One runner per workload for every prediction (its synthetic requests are drawn once), and the
    # predictions made, by flags, deviation and workload: a fit and a search ask the same point again and again.
    _runners: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _memo: dict[tuple[Any, ...], TrialResult] = field(default_factory=dict, compare=False, repr=False)

    def predict(self, flags: Mapping[str, FlagValue], params: BoxParams,
                workload: Mapping[str, Any] | None = None) -> TrialResult:
        """What the twin says `flags` would do, as a trial result (memory, metrics, engine facts), on the
        study's workload or on `workload` (workload settings as JSON: what production served)."""
        deviation = params.deviation()
        load = "" if workload is None else json.dumps(workload, sort_keys=True)
        key = (tuple(sorted((k, str(v)) for k, v in flags.items())), astuple(deviation), load)
        if key not in self._memo:
            runner = self._runners.get(load)
            if runner is None:
                scenario = self.scenario if workload is None else self.scenario.model_copy(
                    update={"workload": WorkloadSettings.model_validate(workload)})
                runner = self._runners[load] = self.make_engine(scenario)
            runner.gpu = params.on(self.preset)
            if len(self._memo) > MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = runner.evaluate(flags)
        return self._memo[key]


def preset_for(inventory: Sequence[str]) -> GpuSpec | None:
    """The preset whose product name the study's GPUs carry ("NVIDIA GeForce RTX 3090 (23.69 GiB)")."""
    names = {entry.split(" (")[0] for entry in inventory}
    if len(names) != 1:
        return None  # no GPU, or mixed cards: one preset cannot stand for them
    name = names.pop()
    return next((g for g in GPU_PRESETS.values() if g.product_name == name), None)


def twin_box(scenario: Scenario, inventory: Sequence[str], make_engine: EngineFactory) -> TwinBox | str:
    """The study's twin, or why there is none."""
    preset = preset_for(inventory)
    if preset is None:
        shown = ", ".join(sorted(set(inventory)))[:120] or "none"
        return f"no simulator preset for the GPUs ({shown})"
    if scenario.workload.requests.kind != "synthetic":
        return "the workload is a trace (the twin replays token counts only)"
    try:
        load_model(scenario.engine.model)
    except AutotunerError:
        return f"the simulator cannot read model {scenario.engine.model!r} (a preset or a local config.json)"
    engine = scenario.engine.model_copy(update={
        "kind": "sim-virtual", "gpus": None,
        "sim": scenario.engine.sim.model_copy(update={"gpu": preset.name, "gpus": len(inventory), "noise": 0.0})})
    twin = scenario.model_copy(update={"engine": engine})
    try:
        build_config(parse_args([twin.engine.model, *flag_argv(twin.engine.flags), "--sim-gpu", preset.name]),
                     twin.engine.resolved_env())
    except (VllmArgError, AutotunerError) as exc:
        return f"the simulator refuses the scenario's flags ({str(exc).splitlines()[-1][:120]})"
    return TwinBox(twin, preset, make_engine)

