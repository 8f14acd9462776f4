"""A study read back from the store: its scenario rebuilt and its trials (our `at_*` rows, never Optuna's
tables, which hold less than the tuner measured). Every reader (export, report, status, confirm, soak)
opens storage through here, so a missing or foreign database gets one message."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from autotuner.backends import backend_for
from autotuner.errors import UserInputError
from autotuner.scenario import Scenario
from autotuner.secrets import display_url, redact
from autotuner.store.db import Store, StudyRecord, TrialRecord, sqlalchemy_url


@dataclass
class StudyData:
    record: StudyRecord
    scenario: Scenario
    trials: list[TrialRecord]
    storage: str
    note: str | None = None  # how the study was picked when no name was given

    @property
    def name(self) -> str:
        return self.record.study_name

    @property
    def objectives(self) -> list[tuple[str, str]]:
        return [(o.metric, o.direction) for o in self.scenario.objectives]

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.kind == "baseline"), None)

    @property
    def simulated(self) -> bool:
        return backend_for(self.scenario).simulated


def open_store(storage: str) -> Store:
    """An existing study database, opened without creating anything in it."""
    url = sqlalchemy_url(storage)
    storage = display_url(storage)  # what messages show: never a password
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_file():
            raise UserInputError(f"storage {storage}: no such database file {path}; give the --storage that "
                                 "`autotuner tune` used")
    store = Store(url, create=False)
    try:
        has_studies = sa.inspect(store.engine).has_table("at_studies")
    except SQLAlchemyError as exc:
        raise UserInputError(redact(f"storage {storage} cannot be read: {getattr(exc, 'orig', exc)}")) from None
    if not has_studies:
        raise UserInputError(f"storage {storage} holds no autotuner study: run `autotuner tune SCENARIO "
                             f"--storage {storage}` first")
    return store


def load_study(storage: str, name: str | None) -> StudyData:
    store = open_store(storage)
    storage = display_url(storage)
    studies = store.studies()
    if not studies:
        raise UserInputError(f"storage {storage} holds no study: run `autotuner tune SCENARIO --storage {storage}` "
                             "first")
    note = None
    if name is None:
        record = studies[-1]  # ordered by creation time
        if len(studies) > 1:
            note = (f"{len(studies)} studies in {storage}; using the latest, {record.study_name} "
                    "(choose one with --study)")
    else:
        found = store.study(name)
        if found is None:
            names = ", ".join(s.study_name for s in studies)
            raise UserInputError(f"study {name!r} is not in {storage}; studies there: {names}")
        record = found
    data = read_study(store, record, storage, note)
    if not data.trials:
        raise UserInputError(f"study {record.study_name} in {storage} has no finished trial yet: run "
                             f"`autotuner tune` with this storage until at least the baseline is measured")
    return data


def read_study(store: Store, record: StudyRecord, storage: str, note: str | None = None) -> StudyData:
    """The study with its scenario rebuilt and its trials (possibly none yet)."""
    try:
        scenario = Scenario.model_validate(record.scenario, context={"stored": True})
    except ValidationError as exc:
        raise UserInputError(f"study {record.study_name}: its stored scenario no longer validates "
                             f"({exc.errors()[0]['msg']}); re-tune with the current autotuner") from None
    return StudyData(record, scenario, store.trials(record.study_name), storage, note)
