"""Opening a study: its name, its sampler, and the checks that the stored study is the one this run
may continue (same setup key, same objective directions), with our own record of it saved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import optuna
from optuna.storages import RDBStorage

from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store, StudyKey, StudyRecord


def study_name_for(scenario: Scenario, key_digest: str) -> str:
    return f"{scenario.name}-{key_digest}"


def make_sampler(seed: int, n_trials: int) -> tuple[optuna.samplers.BaseSampler, str]:
    """Constrained multi-objective: GPSampler when its extra (torch, scipy) is installed, else TPE."""
    startup = max(4, min(10, n_trials // 4))
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup,
                                             constant_liar=True)
        return sampler, f"TPESampler(multivariate, seed={seed}) — install autotuner[gp] for GPSampler"
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup), f"GPSampler(seed={seed})"


@dataclass
class OpenedStudy:
    study: optuna.Study
    storage: RDBStorage
    sampler: str  # the sampler, described
    created: bool  # this run created our record of it


def open_study(scenario: Scenario, store: Store, study_name: str, key: StudyKey, *, seed: int,
               n_trials: int) -> OpenedStudy:
    sampler, described = make_sampler(seed, n_trials)
    storage = store.optuna_storage()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = [o.direction for o in scenario.objectives]
    study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler,
                                directions=directions, load_if_exists=True)
    known = store.study(study_name)
    if known is not None and known.key.digest() != key.digest():
        raise UserInputError(
            f"study {study_name} was tuned for another setup (model {known.key.model_fingerprint}, "
            f"{len(known.key.gpu_inventory)} GPU(s), engine {known.key.engine_version}, workload "
            f"{known.key.workload_fingerprint}); this run is model {key.model_fingerprint}, "
            f"{len(key.gpu_inventory)} GPU(s), engine {key.engine_version}, workload "
            f"{key.workload_fingerprint}. Omit --study to open a new study (and --warm-start "
            f"{study_name} to start from its best configs)")
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise UserInputError(f"study {study_name} was created with directions {stored}, the scenario "
                             f"asks for {directions}: use another --study name")
    created = store.save_study(StudyRecord(study_name, scenario.name, key, scenario.model_dump(mode="json"),
                                           str(scenario.source) if scenario.source else None, time.time()))
    return OpenedStudy(study, storage, described, created)
