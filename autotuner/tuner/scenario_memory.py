"""What a scenario tells the memory model before any trial has run: the model's startup accounting
on one card (``Shape``, vLLM's: weights per card, the profiled activation of one budget step and the
KV cache of one max-model-len request must fit in utilization × total), the most tokens the workload
can put in one step (``step_cap``), and a simulated card's total (``simulated_card_bytes``).
Separate from the fit (tuner/memory_model.py) because it reads the scenario and the model's shape,
not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotuner.backends import backend_for
from autotuner.scenario import Scenario

GIB = 1 << 30
MAX_MODEL_LEN = "max-model-len"
# Startup needs besides weights, activation and KV: non-torch buffers and the CUDA-graph estimate
# (vLLM charges both to the budget; 0.3-0.6 GiB seen on 24 GB cards).
STARTUP_OVERHEAD_BYTES = int(0.5 * GIB)
SAMPLER_BYTES_PER_LOGIT = 16
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Shape:
    """What vLLM's startup needs on one card, from the model's shape (bytes)."""

    weights: int  # weights per card before offload
    kv_per_token: int
    activation_per_token: int  # the profiled forward pass, per budget token
    max_model_len: int
    vocab_size: int = 0

    @classmethod
    def of(cls, scenario: Scenario) -> Shape | None:
        """From a preset or a local config.json; None for a hub name we cannot read offline."""
        from autotuner.catalog.models import load_model
        from autotuner.errors import ModelSpecError

        try:
            spec = load_model(scenario.engine.model)
        except ModelSpecError:
            return None
        tp = scenario.tensor_parallel_size()
        length = scenario.engine.flags.get(MAX_MODEL_LEN, spec.derived_max_model_len)
        try:
            length = int(length)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            length = spec.derived_max_model_len
        return cls(spec.weight_bytes // tp, spec.kv_bytes_per_token(tp), int(activation_per_token(spec, tp)), length,
                   spec.vocab_size)

    def kv_room(self, util: float, budget: float, offload_gib: float, total: int, max_model_len: int,
                max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> float:
        """What the KV cache gets beyond one max-model-len request, as a fraction of the card."""
        weights = max(0.0, self.weights - offload_gib * GIB)
        # The profile run samples min(budget, max-num-seqs) rows: float32 logits plus softmax/sort copies.
        sampler = min(budget, max_num_seqs) * self.vocab_size * SAMPLER_BYTES_PER_LOGIT
        left = util * total - weights - STARTUP_OVERHEAD_BYTES - budget * self.activation_per_token - sampler
        return (left - self.kv_per_token * max_model_len) / total


def step_cap(scenario: Scenario) -> float:
    """Most prompt tokens one step can hold: the streams in flight times the longest prompt (inf when
    the workload does not say, e.g. a trace)."""
    from autotuner.tuner.replay_phase import peak_concurrency

    r = scenario.workload.requests
    if r.kind != "synthetic" or r.prompt_tokens is None:
        return math.inf
    d = r.prompt_tokens
    longest = d.max or d.value or d.high
    if longest is None and d.mean is not None and d.stddev is not None:
        longest = d.mean + 4 * d.stddev
    if longest is None and d.median is not None and d.sigma is not None:
        longest = d.median * math.exp(3 * d.sigma)
    if longest is None:
        return math.inf
    return float(peak_concurrency(scenario) * longest)


def simulated_card_bytes(scenario: Scenario) -> int | None:
    """A simulated GPU's total; a real card's is known once a trial measured it."""
    if not backend_for(scenario).simulated:
        return None
    from autotuner.catalog.gpus import load_gpu

    try:
        return load_gpu(scenario.engine.sim.gpu).memory_bytes
    except Exception:  # an unknown GPU file is the simulator's error to report, not the model's
        return None


def activation_per_token(spec: Any, tp: int) -> float:
    return float(spec.dtype_bytes * (2 * spec.hidden_size + 3 * spec.intermediate_size // max(1, tp)))

