"""A study's fitted memory model carried over to another served model as a prior (warm start, model
swap): ``rescale`` scales the per-token and offload terms by the models' shapes, ``warm_started``
does it from an older study in the store. Separate from the fit: it reads another study and two
model shapes, never this study's trials.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.tuner.memory_model import PRIOR_SD, MemoryModel
from autotuner.tuner.scenario_memory import activation_per_token


def rescale(model: MemoryModel, model_from: Any, model_to: Any, tensor_parallel: int = 1,
            total_bytes: int | None = None) -> MemoryModel:
    """The fitted model of one served model carried to another (warm start, model swap), as a prior:
    the per-token terms scale with the activation per token (hidden and MLP widths), the constant with
    the non-KV weights' share when the card's size is known; the spread widens so that the new
    model's first trials dominate. `model_from`/`model_to` are `autotuner.sim.models.ModelSpec`s (a
    preset name or a config.json directory gives one through `load_model`)."""
    mean, cov, _ = model.fit()
    act_from = activation_per_token(model_from, tensor_parallel)
    act_to = activation_per_token(model_to, tensor_parallel)
    ratio = act_to / act_from if act_from else 1.0
    new_mean = mean.copy()
    new_mean[2] *= ratio
    new_mean[3] *= ratio
    if total_bytes:
        # Offload moves weights off the card; its effect per GiB scales with how much of the card the
        # weights take against the KV cache: by the weight ratio, a first-order guess.
        w_from, w_to = model_from.weight_bytes, model_to.weight_bytes
        new_mean[4] *= w_to / w_from if w_from else 1.0
    spread = np.sqrt(np.diag(cov)) * max(ratio, 1 / ratio if ratio else 1.0) * 2 + PRIOR_SD * 0.5
    return MemoryModel(threshold=model.threshold, total_bytes=model.total_bytes, step_cap=model.step_cap,
                       defaults=dict(model.defaults),
                       prior_mean=new_mean, prior_sd=np.minimum(spread, PRIOR_SD))


def warm_started(model: MemoryModel, store: Store, old_study: str, scenario: Scenario) -> MemoryModel:
    """`model` (a new study's, still without measurements) with the prior of an older study's fitted
    model rescaled to this scenario's model (a model swap or a warm start). Unchanged when the old
    study or either model's shape is unknown (a hub name that is not a local config.json)."""
    from autotuner.catalog.models import load_model
    from autotuner.errors import ModelSpecError

    record = store.study(old_study)
    if record is None or model.observations:
        return model
    try:
        old_scenario = Scenario.model_validate(record.scenario)
        shape_from, shape_to = load_model(old_scenario.engine.model), load_model(scenario.engine.model)
    except (ModelSpecError, ValueError):
        return model
    old = MemoryModel.for_scenario(old_scenario, model.defaults, store.trials(old_study))
    if not old.observations:
        return model
    carried = rescale(old, shape_from, shape_to, scenario.tensor_parallel_size(), old.total_bytes)
    return MemoryModel(threshold=model.threshold, total_bytes=model.total_bytes, step_cap=model.step_cap,
                       defaults=model.defaults, prior_mean=carried.prior_mean, prior_sd=carried.prior_sd,
                       shape=model.shape, card_bytes=model.card_bytes)
