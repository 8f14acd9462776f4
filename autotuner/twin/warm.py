"""Warm start through the twin: after a model swap, the new study's twin takes the new model's shape
and keeps the box's calibration, fitted on the old study's trials (its model, its workload, this box),
as its prior. The box parameters are the box's, whatever model ran on it."""

from __future__ import annotations

import structlog

from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.twin.box import EngineFactory, twin_box
from autotuner.twin.calibrate import calibrate, observations
from autotuner.twin.params import PRIOR, BoxParams

log = structlog.get_logger(__name__)


def warm_prior(store: Store, old_study: str, make_engine: EngineFactory) -> BoxParams:
    record = store.study(old_study)
    if record is None:
        return PRIOR
    try:
        old = Scenario.model_validate(record.scenario)
    except ValueError:
        return PRIOR
    box = twin_box(old, record.key.gpu_inventory, make_engine)
    obs = observations(store.trials(old_study))
    if isinstance(box, str) or not obs:
        return PRIOR
    params = calibrate(box, obs).params
    log.info("twin.warm_prior", study=old_study, params=params.as_dict())
    return params
