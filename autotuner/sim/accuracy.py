"""The simulator's measured error against published vLLM runs: the one place the figures live.

`benchmarks/sim_accuracy.py` measures them (median absolute error over the published runs of
`benchmarks/data/published_runs.yaml`, virtual-time evaluator, default calibration) and says when the
figures below are stale; `sim evaluate` and the export certificate quote `SIM_ACCURACY.quote()`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimAccuracy:
    ttft_pct: float  # median |simulated − reported| / reported, percent
    tpot_pct: float
    tput_pct: float
    runs: int  # published runs scored
    measured: str  # date of the measurement

    def quote(self) -> str:
        return (f"simulated: TTFT ±{self.ttft_pct:.0f} %, TPOT ±{self.tpot_pct:.0f} %, throughput "
                f"±{self.tput_pct:.0f} % against {self.runs} published runs (median error, "
                "benchmarks/sim_accuracy.py)")


SIM_ACCURACY = SimAccuracy(ttft_pct=13.0, tpot_pct=10.0, tput_pct=12.0, runs=23, measured="2026-11-30")
