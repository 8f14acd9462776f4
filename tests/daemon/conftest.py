"""The daemon's fixture: production deployments under the test's tmp_path, torn down at the end (see
tests/support/daemon.py for the deployment itself)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Deployment, make_deployment, tear_down


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(start: bool = True, **kwargs: Any) -> Deployment:
        d = make_deployment(tmp_path / f"prod{len(made)}", start=False, **kwargs)
        made.append(d)  # torn down even when its start fails
        if start:
            d.start_production()
        return d

    yield make
    for d in made:
        tear_down(d)
