"""The trials a study starts with, before the sampler's own: the baseline (vLLM's defaults for this
GPU), the user's current config, and after a model swap another study's best configs (warm start).
Each is queued once per study, whatever number of runs resumes it.
"""

from __future__ import annotations

import time

import optuna
from optuna.storages import RDBStorage

from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.store.db import Store
from autotuner.trials.outcomes import TrialKind
from autotuner.tuner.space import FlagRules, Space
from autotuner.vllm import FlagValue

# A shared study is seeded by the worker that created it; others wait this long before doing it for a
# creator that died meanwhile (seconds).
SEED_GRACE_S = 60.0
# Warm starts taken from the old study's feasible Pareto front.
MAX_WARM_STARTS = 8


def seed_trials(study: optuna.Study, *, scenario: Scenario, space: Space, rules: FlagRules, store: Store,
                study_name: str, created: bool, warm_start: str | None, storage: RDBStorage,
                warm_configs: bool = True) -> None:
    """Trial 0 is the baseline (vLLM's defaults for this GPU), then the user's current config, then
    (`warm_configs`) the warm start's best configs."""
    trials = study.get_trials(deepcopy=False)
    if not created and not store.is_sqlite and not trials:
        # A shared study: the worker that created it seeds it, unless it died doing so long ago.
        record = store.study(study_name)
        if record is not None and time.time() - record.created_at < SEED_GRACE_S:
            return
    kinds = {t.user_attrs.get("kind") for t in trials}
    if TrialKind.BASELINE not in kinds:
        defaults = {k: v for k, v in rules.defaults().items() if k in space.distributions}
        study.enqueue_trial(space.clamp(defaults), user_attrs={"kind": TrialKind.BASELINE})
    if scenario.current_config and TrialKind.CURRENT not in kinds:
        study.enqueue_trial(space.clamp(scenario.current_config), user_attrs={"kind": TrialKind.CURRENT})
    if warm_start and TrialKind.WARM_START not in kinds:
        configs = warm_start_configs(warm_start, storage, store.url)  # a wrong name is refused either way
        for flags in configs if warm_configs else []:
            study.enqueue_trial(space.clamp(flags), user_attrs={"kind": TrialKind.WARM_START})


def warm_start_configs(name: str, storage: RDBStorage, url: str) -> list[dict[str, FlagValue]]:
    """After a model swap: the old study's feasible Pareto configs are good first guesses (their
    objective values do not transfer; the configurations do)."""
    try:
        old = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserInputError(f"--warm-start {name}: no such study in {url}") from None
    return [dict(t.params) for t in old.best_trials if t.user_attrs.get("feasible")][:MAX_WARM_STARTS]
