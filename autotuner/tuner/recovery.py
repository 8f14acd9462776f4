"""Crash recovery: the trials a killed tuner left RUNNING are failed and their candidates queued
again, so that a resumed study measures them instead of waiting on them forever.

Separate because it reaches into Optuna's storage API (Optuna has no public call to fail another
process's RUNNING trial) and must stay in step with our own trial rows.
"""

from __future__ import annotations

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from autotuner.store.db import Store
from autotuner.trials.outcomes import Outcome, TrialKind


def recover(study: optuna.Study, storage: RDBStorage, store: Store, study_name: str) -> list[int]:
    """Trials left RUNNING by a killed tuner: fail them and queue their parameters again (their
    numbers returned). With SQLite we are the only worker (the study lock says so); on a shared
    database only trials whose heartbeat went stale are another worker's dead ones, and Optuna
    re-queues them."""
    if not store.is_sqlite:
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return sorted(before - after)
    requeued = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        store.delete_trial(study_name, t.number)  # written just before the kill, never told
        storage.set_trial_user_attr(t._trial_id, "outcome", Outcome.INTERRUPTED)
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        waiting = [w.params for w in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
        # No parameters: killed while asking (trials side by side ask while others run); nothing to redo.
        if t.params and t.params not in waiting:
            study.enqueue_trial(t.params, user_attrs={"kind": t.user_attrs.get("kind", TrialKind.SEARCH),
                                                      "requeued_from": t.number})
        requeued.append(t.number)
    return requeued
