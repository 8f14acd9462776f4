"""Did `--cpu-offload-gb` really offload? Some vLLM builds accept the flag and ignore it (vLLM #51396:
the V2 model runner before 0.29), and such a trial looks like memory saved for free.

Two pieces of evidence, both required: the engine's load log names the offloaded amount ("Total CPU
offloaded parameters: X GiB"), and the weights' GPU footprint ("Model loading took X GiB") is lower
than that of a comparable trial without offload, by at least half the amount asked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotuner.store.db import TrialRecord
from autotuner.tuner.trial import TrialResult

OFFLOADED = re.compile(r"Total CPU offloaded parameters: ([\d.]+)")
# A footprint drop below this share of the requested amount does not count as offloaded.
MIN_DROP_SHARE = 0.5


def logged_offload_gib(result: TrialResult) -> float | None:
    """The amount the engine logged at load: from the simulator's evaluation, else the engine log."""
    value = result.engine.get("offloaded_gib")
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    lines = list(result.log_tail)
    path = result.engine.get("log_path")
    if isinstance(path, str) and Path(path).is_file():
        lines = Path(path).read_text(errors="replace").splitlines()
    found = [float(m.group(1)) for line in lines if (m := OFFLOADED.search(line))]
    return found[-1] if found else None


def comparable(trials: list[TrialRecord], flags: dict[str, Any]) -> TrialRecord | None:
    """A trial without offload that loaded the same weights: its weights footprint is the reference."""
    refs = [t for t in trials if not float(t.flags.get("cpu-offload-gb") or 0)
            and isinstance(t.engine.get("model_load_gib"), int | float)]
    if not refs:
        return None
    # Prefer the one that differs in the fewest flags (the footprint of the weights hardly depends on them).
    return min(refs, key=lambda t: (sum(t.flags.get(k) != v for k, v in flags.items() if k != "cpu-offload-gb"),
                                    t.trial_number))


def check(result: TrialResult, trials: list[TrialRecord]) -> dict[str, Any] | None:
    """None when no offload was asked; else {verified, requested_gib, logged_gib, footprint, reason}."""
    requested = float(result.flags.get("cpu-offload-gb") or 0)
    if requested <= 0:
        return None
    logged = logged_offload_gib(result)
    loaded = result.engine.get("model_load_gib")
    ref = comparable(trials, dict(result.flags))
    ref_gib = ref.engine.get("model_load_gib") if ref is not None else None
    out: dict[str, Any] = {"requested_gib": requested, "logged_gib": logged, "model_load_gib": loaded,
                           "reference_trial": ref.trial_number if ref is not None else None,
                           "reference_model_load_gib": ref_gib}
    if logged is None:
        out.update(verified=False, reason=f"--cpu-offload-gb {requested:g} was asked, but the engine's load log "
                   "names no offloaded parameters: this engine ignores the flag (vLLM #51396)")
    elif not isinstance(loaded, int | float) or not isinstance(ref_gib, int | float):
        out.update(verified=None, reason="no weights footprint to compare with (no trial without offload "
                   "logged one)")
    elif ref_gib - loaded < MIN_DROP_SHARE * min(requested, logged):
        out.update(verified=False, reason=f"weights take {loaded:.2f} GiB on the GPU, against {ref_gib:.2f} GiB "
                   f"without offload (trial {out['reference_trial']}): the footprint did not drop by the "
                   f"{requested:g} GiB asked")
    else:
        out.update(verified=True, reason=f"logged {logged:.2f} GiB offloaded; weights {loaded:.2f} GiB on the "
                   f"GPU against {ref_gib:.2f} GiB without offload")
    return out
