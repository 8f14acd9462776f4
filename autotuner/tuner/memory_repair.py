"""Repair: the nearest candidate likely to serve, for one the memory model ruled out (tuner/memory_model.py
screens; this moves). Separate because it searches the space around a candidate, where the model only judges one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autotuner.tuner.memory_model import BUDGET, OFFLOAD, PROBE_MAX_P_OVER, UTIL, MemoryModel, flag_number
from autotuner.tuner.space import Space
from autotuner.vllm import FlagValue

# Repair: a share of the utilization range given up costs this many shares of the budget's (log) range.
# Utilization is the KV cache of every request in flight; a smaller budget only splits long prefills
# into more chunks, and a budget beyond what one step holds buys nothing.
UTIL_WEIGHT = 3.0


def repair(model: MemoryModel, space: Space, flags: Mapping[str, FlagValue],
           max_p_over: float = PROBE_MAX_P_OVER) -> dict[str, FlagValue] | None:
    """The nearest candidate that is likely to serve to one the model ruled out: utilization (up or
    down), the token budget (log scale) and offload each measured as a share of its range, utilization
    counting UTIL_WEIGHT times, so the cheapest axis moves first — a budget shrunk before a KV cache
    given up, more utilization for a candidate that cannot start, no offload where none is needed.
    The sampler asks where the optimum is, and the optimum of a memory-bound study sits just under the wall."""
    util = space.distributions.get(UTIL)
    budget = space.distributions.get(BUDGET)
    offload = space.distributions.get(OFFLOAD)
    if util is None or not (model.observations or model.no_room or model.kv_room(flags) is not None):
        return None
    u_lo, u_hi = float(getattr(util, "low", 0.0)), float(getattr(util, "high", 1.0))
    step = getattr(util, "step", None) or 0.01
    u0 = float(flag_number(flags, UTIL, model.defaults, 0.9))
    b0 = float(flag_number(flags, BUDGET, model.defaults, 8192))
    o0 = float(flag_number(flags, OFFLOAD, model.defaults, 0.0))
    utils = [u_lo + k * step for k in range(round((u_hi - u_lo) / step) + 1)] if u_hi > u_lo else [u0]
    if budget is not None:
        b_lo, b_hi = float(getattr(budget, "low", 1)), float(getattr(budget, "high", b0))
        budgets = [b for b in (b0 * 0.8 ** j for j in range(-3, 13)) if b_lo - 1e-9 <= b <= b_hi + 1e-9]
        b_span = max(math.log(b_hi / b_lo), 1e-9)
    else:
        budgets, b_span = [b0], 1.0
    offloads = sorted({0.0, o0}) if offload is not None else [o0]
    o_span = max(float(getattr(offload, "high", 1.0)) - float(getattr(offload, "low", 0.0)), 1e-9) if offload else 1.0
    u_span = max(u_hi - u_lo, 1e-9)

    def distance(c: tuple[float, float, float]) -> tuple[float, float]:
        u, b, o = c
        # Dropping offload costs nothing (it only slows every step); any other offload change does.
        moved = 0.0 if o == 0.0 else abs(o - o0) / o_span
        return (UTIL_WEIGHT * abs(u - u0) / u_span + abs(math.log(b / b0)) / b_span + moved, -u)

    for u, b, o in sorted(((u, b, o) for u in utils for b in budgets for o in offloads), key=distance):
        candidate = {**flags, UTIL: round(u, 6), BUDGET: int(b)}
        if offload is not None:
            candidate[OFFLOAD] = o
        candidate = {**flags, **space.to_flags(space.clamp(candidate))}
        if _same(candidate, flags):
            continue
        if model.screen(candidate) is None and (not model.observations
                                                or model.predict(candidate).p_over <= max_p_over):
            return candidate
    return None


def _same(a: Mapping[str, FlagValue], b: Mapping[str, FlagValue]) -> bool:
    return all(a.get(k) == b.get(k) for k in (UTIL, BUDGET, OFFLOAD))
