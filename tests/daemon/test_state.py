"""The cycle as data: each transition one row update and one event, in order; no step skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from autotuner.daemon.state import (
    CONFIRM,
    DEPLOY,
    DEPLOYED,
    DONE,
    DRAIN,
    TUNE,
    VERIFY,
    WINDOW,
    CycleStore,
    events,
)
from autotuner.store.db import Store


def test_a_cycle_walks_its_states_and_every_step_is_an_event(tmp_path: Path) -> None:
    states = CycleStore(Store(str(tmp_path / "a.db")), "prod")
    cycle = states.begin("model-swap", {"before": "a", "after": "b"}, {"root": "b"})
    assert states.open_cycle() is not None and states.open_cycle().id == cycle.id
    states.transition(cycle, WINDOW, previous_flags={"x": 1})
    for step in (DRAIN, TUNE, CONFIRM):
        states.transition(cycle, step)
    states.transition(cycle, DEPLOY, candidate_flags={"x": 2}, candidate_trial=3)
    with pytest.raises(ValueError, match="deploy → done is not a step"):
        states.transition(cycle, DONE, outcome=DEPLOYED)
    states.transition(cycle, VERIFY)
    states.transition(cycle, DONE, outcome=DEPLOYED)

    # What a restarted daemon reads back: the same cycle, nothing open.
    again = CycleStore(Store(str(tmp_path / "a.db")), "prod")
    assert again.open_cycle() is None
    deployed = again.last_deployed()
    assert deployed is not None and deployed.candidate_flags == {"x": 2} and deployed.previous_flags == {"x": 1}
    assert deployed.evidence == {"before": "a", "after": "b"} and deployed.ended_at is not None
    with again.engine.connect() as conn:
        rows = conn.execute(sa.select(events).order_by(events.c.id)).all()
    assert [(r.from_state, r.to_state) for r in rows] == [
        (None, "detect"), ("detect", "window"), ("window", "drain"), ("drain", "tune"), ("tune", "confirm"),
        ("confirm", "deploy"), ("deploy", "verify"), ("verify", "done")]
    assert json.loads(rows[-1].detail) == {"outcome": "deployed"}
    assert again.counts() == {"cycles": 1, "trials": 0, DEPLOYED: 1}
    # Another deployment in the same database sees none of it.
    assert CycleStore(again.store, "other").cycles() == []
