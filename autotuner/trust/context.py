"""What a trust step works on: the study (Optuna's and our rows), its scenario, a trial runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import optuna
import structlog

from autotuner.analysis.study_data import StudyData, read_study
from autotuner.catalog.models import weights_per_gpu_gib
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.tuner.runners import TrialRunner
from autotuner.tuner.space import Space, build_space

log = structlog.get_logger(__name__)
Event = Callable[[str, dict[str, Any]], None]


@dataclass
class TrustContext:
    store: Store
    study_name: str
    runner: TrialRunner
    scenario: Scenario
    # A runner for another workload on the same engine (the soak's); tune and the CLI pass theirs.
    runner_for: Callable[[Scenario], TrialRunner]
    on_event: Event = field(default=lambda _k, _d: None)

    def __post_init__(self) -> None:
        self.space: Space = build_space(self.scenario)

    @cached_property
    def weights_gib(self) -> float | None:
        """A GPU's share of the weights by the model's shape (the offload check's stand-in), read once."""
        return weights_per_gpu_gib(self.scenario.engine.model, self.scenario.tensor_parallel_size())

    def make_runner(self, scenario: Scenario) -> TrialRunner:
        return self.runner_for(scenario)

    def study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return optuna.load_study(study_name=self.study_name, storage=self.store.optuna_storage())
        except KeyError:
            raise UserInputError(f"study {self.study_name} is not in {self.store.url}") from None

    def data(self) -> StudyData:
        record = self.store.study(self.study_name)
        if record is None:
            raise UserInputError(f"study {self.study_name} is not in {self.store.url}: run `autotuner tune` first")
        return read_study(self.store, record, self.store.url)
