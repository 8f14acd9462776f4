"""What a trigger's evidence changes in the scenario a cycle tunes: the model production now serves, the
prompt lengths it saw (its /metrics histogram, the +Inf bucket bounded by the served context) and the
prompts of the step that crashed it (vLLM's scheduler dump), replayed first by every trial and the soak.

`tune_changes` returns dotted-path → value changes that `cycle.apply_changes` applies to the configured
scenario; they are stored with the cycle, so a resumed cycle tunes exactly what it started to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotuner.daemon.triggers import CRASH, MODEL_SWAP, OBSERVED_LENGTHS, OOM, histogram_of
from autotuner.scenario import LengthSettings, Scenario
from autotuner.tuner.space import build_space
from autotuner.twin.calibrate import Observation
from autotuner.twin.production import production_observation
from autotuner.verify import CONTEXT_MARGIN_TOKENS
from autotuner.vllm import FlagValue
from autotuner.watch.drift import context_of
from autotuner.watch.served import ServedWindow
from autotuner.watch.snapshot import LengthHistogram

# Triggers whose evidence may name the requests of the step that killed the engine.
CRASHED = (OOM, CRASH)


def _quantile(hist: LengthHistogram, q: float, upper: int | None) -> float | None:
    value = hist.quantile(q, upper=upper)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def served_context(evidence: dict[str, Any], observed: dict[str, Any] | None = None) -> int | None:
    """The max_model_len production served when the evidence was taken (the trigger's own, else the
    reference identity's): no prompt it saw was longer."""
    for source in (evidence, observed or {}):
        value = source.get("max_model_len")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_cap(scenario: Scenario, context: int | None) -> int | None:
    """The longest prompt the tuned engine's context holds beside the longest output (None: unknown)."""
    context = context_of(scenario) or context
    if context is None:
        return None
    out = scenario.workload.requests.output_tokens
    out_max = out.value if out.kind == "fixed" else (out.max or out.high or 0)
    return max(1, context - (out_max or 0) - CONTEXT_MARGIN_TOKENS)


def observed_prompts(scenario: Scenario, evidence: dict[str, Any],
                     observed: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The prompt lengths production served (its /metrics histogram), as the scenario's length settings:
    uniform from the median to the longest seen, cut to what the context holds. Prompts above vLLM's last
    finite bucket are counted up to the served max_model_len, not at that bucket's bound."""
    hist = histogram_of(evidence.get("prompt_tokens"))
    if hist is None or hist.count < 1:
        return None
    upper = served_context(evidence, observed)
    high = _quantile(hist, 1.0, upper) or _quantile(hist, 0.99, upper)
    low = _quantile(hist, 0.5, upper)
    if high is None:
        return None
    cap = prompt_cap(scenario, upper)
    if cap is not None:
        high = min(high, cap)
    high_i = max(1, int(high))
    return {"kind": "uniform", "low": max(1, min(int(low or 1), high_i)), "high": high_i}


def crash_prompts(scenario: Scenario, evidence: dict[str, Any], observed: dict[str, Any] | None = None) -> list[int]:
    """The lengths of the requests in the steps that killed production (longest first), each cut to what
    the tuned context holds: replayed once each before the distribution."""
    raw = evidence.get("crash_prompts") or []
    cap = prompt_cap(scenario, served_context(evidence, observed))
    lengths = [int(n) for n in raw if isinstance(n, int | float) and not isinstance(n, bool) and n >= 1]
    return [min(n, cap) if cap is not None else n for n in lengths]


def widened(prompts: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    """Length settings whose range also covers `lengths`, so that what the soak takes as the longest prompt
    (and what the search space sizes its token budget for) is at least the longest that crashed."""
    if not lengths:
        return prompts
    lo, hi = min(lengths), max(lengths)
    settings = LengthSettings.model_validate(prompts)
    update: dict[str, Any] = {"min": min(settings.min, lo)}
    if settings.max is not None:
        update["max"] = max(settings.max, hi)
    if settings.kind in ("fixed", "uniform"):
        low = settings.value if settings.kind == "fixed" else settings.low
        high = settings.value if settings.kind == "fixed" else settings.high
        update |= {"kind": "uniform", "value": None, "low": min(low or lo, lo), "high": max(high or hi, hi)}
    return LengthSettings.model_validate({**settings.model_dump(), **update}).model_dump(exclude_none=True)


def tune_changes(scenario: Scenario, trigger_kind: str, evidence: dict[str, Any],
                 observed: dict[str, Any] | None = None) -> dict[str, Any]:
    """What this cycle's scenario changes in the configured one: the model production now serves (after a
    swap, and in every later cycle), the prompt lengths it saw, and after an OOM or crash the prompts of the
    step that died, replayed first (`include_prompt_tokens`) with the length range widened to hold them."""
    changes: dict[str, Any] = {}
    root = evidence.get("root") if trigger_kind == MODEL_SWAP else (observed or {}).get("root")
    if root and root != scenario.engine.model:
        changes["engine.model"] = root
    if trigger_kind in OBSERVED_LENGTHS:
        prompts = observed_prompts(scenario, evidence, observed)
        if prompts is not None:
            changes["workload.requests.prompt_tokens"] = prompts
    requests = scenario.workload.requests
    if trigger_kind in CRASHED and requests.kind == "synthetic":
        lengths = crash_prompts(scenario, evidence, observed)
        if lengths:
            changes["workload.requests.include_prompt_tokens"] = lengths
            base = changes.get("workload.requests.prompt_tokens") or requests.prompt_tokens.model_dump(
                exclude_none=True)
            changes["workload.requests.prompt_tokens"] = widened(base, lengths)
    return changes


# The cycle's evidence key for what production served while the trigger fired (watch/served.py) and the
# tuned flags it served it with: the twin's calibration with no downtime.
SERVED = "served"


def served_evidence(window: ServedWindow | None, flags: Mapping[str, FlagValue] | None,
                    scenario: Scenario) -> dict[str, Any]:
    """The cycle's evidence entry for production's served window: only the flags the tuner tunes (a config
    file may hold anything, an API key among it), with their values as production ran them."""
    if window is None or not flags:
        return {}
    space = build_space(scenario)
    tuned = set(space.to_flags(space.clamp(flags)))
    return {SERVED: {"window": window.as_dict(), "flags": {k: v for k, v in flags.items() if k in tuned}}}


def twin_evidence(scenario: Scenario, evidence: Mapping[str, Any]) -> list[Observation]:
    """Production's served window, as the cycle's twin observes it (none when it served another model)."""
    served = evidence.get(SERVED)
    if not isinstance(served, dict) or not isinstance(served.get("window"), dict):
        return []
    obs = production_observation(scenario, ServedWindow.from_dict(served["window"]), dict(served.get("flags") or {}))
    return [obs] if obs is not None else []
