"""The box parameters the twin fits, each with its prior (the simulator's defaults: a preset deviates
in nothing) and the evidence that informs it.

- compute_efficiency (log-normal prior, σ 0.25): prefill steps, so TTFT and throughput;
- bandwidth_efficiency (log-normal, σ 0.15): weight and KV streams, so TPOT;
- step_overhead_s (normal, mean roofline.STEP_OVERHEAD_S, σ 1.5 ms): the host's cost per step, TPOT at
  small batches;
- non_torch_gib (from vLLM's logged KV cache size: the gap between the tokens the twin plans and the
  tokens the engine logged is memory the twin did not know of);
- transient_scale (from the measured peaks: the unprofiled transient per step token).
The priors are wide on purpose: a field report's box runs 10–30 % off its datasheet (TUNA, the 3090
rows of benchmarks/data/published_runs.yaml); narrower priors would keep a slow box's twin optimistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autotuner.catalog.gpus import BoxDeviation, GpuSpec
from autotuner.sim.roofline import STEP_OVERHEAD_S

# The fitted performance parameters, in the order of the fit's vector (log efficiencies, overhead).
PERF = ("compute_efficiency", "bandwidth_efficiency", "step_overhead_s")
PRIOR_MEAN = (0.0, 0.0, STEP_OVERHEAD_S)
PRIOR_SIGMA = (0.25, 0.15, 1.5e-3)
TRANSIENT_PRIOR_SIGMA = 0.5  # × the simulator's unprofiled transient
NON_TORCH_PRIOR_SIGMA_GIB = 0.5


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float  # 95 % interval
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class BoxParams:
    """The twin's box: the preset's deviation as fitted, with intervals."""

    compute_efficiency: Estimate = Estimate(1.0, math.exp(-0.49), math.exp(0.49))
    bandwidth_efficiency: Estimate = Estimate(1.0, math.exp(-0.29), math.exp(0.29))
    step_overhead_s: Estimate = Estimate(STEP_OVERHEAD_S, 0.0, STEP_OVERHEAD_S + 2.9e-3)
    non_torch_gib: Estimate = Estimate(0.0, 0.0, 0.98)
    transient_scale: Estimate = Estimate(1.0, 0.02, 1.98)
    fitted_on: int = 0  # measured trials the fit used
    notes: list[str] = field(default_factory=list)

    def deviation(self) -> BoxDeviation:
        return BoxDeviation(compute_efficiency=self.compute_efficiency.value,
                            bandwidth_efficiency=self.bandwidth_efficiency.value,
                            step_overhead_s=max(0.0, self.step_overhead_s.value),
                            non_torch_gib=max(0.0, self.non_torch_gib.value),
                            transient_scale=max(0.0, self.transient_scale.value))

    def on(self, preset: GpuSpec) -> GpuSpec:
        """The preset with this deviation (the twin always starts from the preset)."""
        return replace(preset, deviation=self.deviation())

    def perf_vector(self) -> list[float]:
        return [math.log(self.compute_efficiency.value), math.log(self.bandwidth_efficiency.value),
                self.step_overhead_s.value]

    def as_dict(self) -> dict[str, object]:
        return {"compute_efficiency": self.compute_efficiency.as_dict(),
                "bandwidth_efficiency": self.bandwidth_efficiency.as_dict(),
                "step_overhead_s": self.step_overhead_s.as_dict(), "non_torch_gib": self.non_torch_gib.as_dict(),
                "transient_scale": self.transient_scale.as_dict(), "fitted_on": self.fitted_on,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BoxParams:
        def est(name: str) -> Estimate:
            raw = data[name]
            assert isinstance(raw, dict)
            return Estimate(float(raw["value"]), float(raw["low"]), float(raw["high"]))

        return cls(est("compute_efficiency"), est("bandwidth_efficiency"), est("step_overhead_s"),
                   est("non_torch_gib"), est("transient_scale"), int(str(data.get("fitted_on", 0))),
                   [str(n) for n in data.get("notes", []) or []])  # type: ignore[union-attr]


PRIOR = BoxParams()
