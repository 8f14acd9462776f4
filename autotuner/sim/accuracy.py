"""The simulator's measured error against published vLLM runs, as quoted to users.

`benchmarks/sim_accuracy.py` measures it (virtual-time evaluator against every row of
`benchmarks/data/published_runs.yaml`) and writes `accuracy_figures.json` beside this module: the
median and the worst absolute error per metric, over all rows and per GPU class (RTX 3090, RTX 4090,
datacenter). Nothing here is typed by hand. The file also keeps a digest of what the figures depend
on (the published rows and the simulator's performance sources), so a test can tell when they are
stale (`tests/sim/test_accuracy.py`). `sim evaluate` and the export certificate quote
`SIM_ACCURACY.quote()`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

FIGURES = Path(__file__).with_name("accuracy_figures.json")
# The sources whose numbers the figures measure: a change to any of them (or to the published rows)
# makes the stored figures stale until benchmarks/sim_accuracy.py runs again.
_PACKAGE = Path(__file__).resolve().parents[1]
MEASURED_SOURCES = ("sim/roofline.py", "sim/memory.py", "sim/evaluate.py", "sim/core.py", "sim/kv_cache.py",
                    "sim/tokens.py", "catalog/gpus.py", "catalog/models.py")
METRICS = {"ttft": "TTFT", "tpot": "TPOT", "tput": "throughput"}
CLASS_NAMES = {"rtx-3090": "RTX 3090", "rtx-4090": "RTX 4090", "datacenter": "datacenter"}


def inputs_digest(published_runs: bytes) -> str:
    """sha256 over the published rows and the simulator sources the figures were measured with."""
    h = hashlib.sha256(published_runs)
    for rel in MEASURED_SOURCES:
        h.update(rel.encode())
        h.update((_PACKAGE / rel).read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class MetricError:
    n: int
    median_pct: float  # median |simulated − reported| / reported, percent
    worst_pct: float  # the signed error of the worst row, percent
    worst_row: str


@dataclass(frozen=True)
class SimAccuracy:
    runs: int  # published runs scored
    measured: str  # date of the measurement
    digest: str  # inputs_digest() at measurement time
    classes: dict[str, dict[str, MetricError]]  # "all" and each GPU class → metric → error

    def _median(self, metric: str) -> float:
        err = self.classes.get("all", {}).get(metric)
        return err.median_pct if err else float("nan")

    @property
    def ttft_pct(self) -> float:
        return self._median("ttft")

    @property
    def tpot_pct(self) -> float:
        return self._median("tpot")

    @property
    def tput_pct(self) -> float:
        return self._median("tput")

    def class_quote(self, name: str) -> str:
        parts = [f"{METRICS[m]} median ±{e.median_pct:.0f} %, worst {e.worst_pct:+.0f} % at {e.worst_row}"
                 for m, e in self.classes.get(name, {}).items() if e.n]
        return f"{CLASS_NAMES.get(name, name)}: " + "; ".join(parts) if parts else ""

    def quote(self) -> str:
        per_class = " | ".join(q for q in (self.class_quote(c) for c in CLASS_NAMES) if q)
        return (f"simulated: TTFT ±{self.ttft_pct:.0f} %, TPOT ±{self.tpot_pct:.0f} %, throughput "
                f"±{self.tput_pct:.0f} % against {self.runs} published runs (median error, "
                f"benchmarks/sim_accuracy.py, {self.measured})" + (f" — {per_class}" if per_class else ""))

    def to_json(self) -> dict[str, object]:
        return {"runs": self.runs, "measured": self.measured, "digest": self.digest,
                "classes": {c: {m: vars(e) for m, e in ms.items()} for c, ms in self.classes.items()}}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> SimAccuracy:
        classes = data["classes"]
        assert isinstance(classes, dict)
        return cls(runs=int(str(data["runs"])), measured=str(data["measured"]), digest=str(data["digest"]),
                   classes={c: {m: MetricError(**e) for m, e in ms.items()} for c, ms in classes.items()})


def load(path: Path = FIGURES) -> SimAccuracy:
    """The stored figures; none (0 runs) when the file is missing, so the script that writes it can run."""
    if not path.is_file():
        return SimAccuracy(runs=0, measured="never", digest="", classes={})
    return SimAccuracy.from_json(json.loads(path.read_text()))


SIM_ACCURACY = load()
