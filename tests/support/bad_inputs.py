"""The bad-input corpus (tests/fixtures/bad_inputs/) and the scenario through which each case reaches `tune`:
shared by tests/test_bad_inputs.py and benchmarks/fault_matrix.py, so both feed the tuner the same way (it
lives with the suite's other shared helpers, in tests/support/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).parent.parent / "fixtures" / "bad_inputs"


def scenario_for(case: Path, scratch: Path) -> Path:
    """A scenario file as is; a model directory (or its config.json), a GPU file or a trace wrapped in the smallest
    scenario that uses it, written into `scratch`."""
    if case.name == "config.json":
        case = case.parent
    kind = case.parent.name
    if kind == "scenarios":
        return case
    engine: dict[str, Any] = {"kind": "sim-virtual", "model": "llama-2-7b", "sim": {"gpu": "a100-80gb"}}
    doc: dict[str, Any] = {"engine": engine}
    if kind == "traces":
        engine["kind"] = "sim"
        doc["workload"] = {"requests": {"kind": "trace", "path": str(case)}, "arrivals": {"kind": "trace"}}
    elif kind == "gpus":
        engine["sim"] = {"gpu": str(case)}
    else:
        engine["model"] = str(case)
    path = scratch / f"{kind}-{case.stem}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
