"""Did the offload really offload? Some vLLM builds accept `--cpu-offload-gb` and ignore it (vLLM
#51396: the V2 model runner before 0.29), and such a trial looks like memory saved for free.

Two pieces of evidence, both required: the engine's load log names the offloaded amount (UVA: "Total
CPU offloaded parameters: X GiB"; prefetch: "[PrefetchOffloader] Initialized N modules. Total GPU
memory saved: X GB, Static buffer pool: Y GB"), and the weights' GPU footprint ("Model loading
took X GiB") is lower than that of a comparable trial without offload, by at least half the amount
asked (UVA) or logged (prefetch, whose flags name layers, not GiB).

Where no trial without offload loaded the weights — the box where only offload serves, whose every such
trial runs out of memory at load — the footprint is held against the GPU's share of the weights by the
model's shape instead, provided the shape accounts for what loaded: the footprint plus what the engine
logged as offloaded within SHAPE_TOLERANCE of it (a quantized checkpoint, whose weights the shape
overstates, is then left unverified rather than passed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotuner.store.db import TrialRecord
from autotuner.trials.offload_axis import from_flags
from autotuner.trials.result import TrialResult

OFFLOADED = re.compile(r"Total CPU offloaded parameters: ([\d.]+)")
# Decimal GB, as the prefetch offloader prints them.
PREFETCHED = re.compile(r"\[PrefetchOffloader\] Initialized (\d+) modules\. Total GPU memory saved: ([\d.]+) GB")
# A footprint drop below this share of the requested amount does not count as offloaded.
MIN_DROP_SHARE = 0.5
# How far the footprint plus the logged offload may be from the shape's weights for the shape to stand in
# for a trial without offload (embedding padding, buffers and rounding in the load log).
SHAPE_TOLERANCE = 0.1


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
    if not found:  # the prefetch backend: one line per worker, per-GPU bytes in decimal GB
        found = [float(m.group(2)) * 1e9 / (1 << 30) for line in lines if (m := PREFETCHED.search(line))]
    return found[-1] if found else None


def comparable(trials: list[TrialRecord], flags: dict[str, Any]) -> TrialRecord | None:
    """A trial without offload that loaded the same weights: its weights footprint is the reference."""
    refs = [t for t in trials if from_flags(t.flags, None)[0] == "none"
            and isinstance(t.engine.get("model_load_gib"), int | float)]
    if not refs:
        return None
    # Prefer the one that differs in the fewest flags (the footprint of the weights hardly depends on them).
    return min(refs, key=lambda t: (sum(t.flags.get(k) != v for k, v in flags.items() if k != "cpu-offload-gb"),
                                    t.trial_number))


def check(result: TrialResult, trials: list[TrialRecord], shape_gib: float | None = None) -> dict[str, Any] | None:
    """None when no offload was asked; else {verified, requested_gib, logged_gib, footprint, reason}.
    `shape_gib`: the GPU's share of the weights by the model's shape, for when no trial without offload
    loaded them."""
    mode, requested = from_flags(result.flags, None)
    if mode == "none":
        return None
    logged = logged_offload_gib(result)
    if mode == "prefetch":  # the flags name layers; what the engine logged is the amount to find again
        return _check_prefetch(result, trials, logged, shape_gib)
    out: dict[str, Any] = {"requested_gib": requested, "logged_gib": logged,
                           **_footprints(result, trials, logged, shape_gib)}
    return _judge(out, logged, expected_drop=None if logged is None else min(requested, logged),
                  not_logged=f"--cpu-offload-gb {requested:g} was asked, but the engine's load log names no "
                  "offloaded parameters: this engine ignores the flag (vLLM #51396)",
                  asked=f"{requested:g} GiB asked",
                  held=f"logged {logged or 0:.2f} GiB offloaded")


def _footprints(result: TrialResult, trials: list[TrialRecord], logged: float | None,
                shape_gib: float | None) -> dict[str, Any]:
    """The candidate's weights on the GPU, and a comparable trial's without offload (either backend), else
    the shape's weights when they account for the footprint and the logged offload."""
    loaded = result.engine.get("model_load_gib")
    ref = comparable(trials, dict(result.flags))
    out: dict[str, Any] = {"model_load_gib": loaded,
                           "reference_trial": ref.trial_number if ref is not None else None,
                           "reference_model_load_gib": ref.engine.get("model_load_gib") if ref is not None else None}
    if (ref is None and shape_gib is not None and isinstance(loaded, int | float) and logged is not None
            and abs(loaded + logged - shape_gib) <= SHAPE_TOLERANCE * shape_gib):
        out.update(reference_model_load_gib=shape_gib, reference="the model's shape")
    return out


def _check_prefetch(result: TrialResult, trials: list[TrialRecord], logged: float | None,
                    shape_gib: float | None) -> dict[str, Any]:
    flags = dict(result.flags)
    plan = ", ".join(f"--{k} {flags[k]}" for k in ("offload-backend", "offload-group-size", "offload-num-in-group",
                                                    "offload-prefetch-step") if k in flags)
    out: dict[str, Any] = {"backend": "prefetch", "requested_gib": None, "logged_gib": logged,
                           **_footprints(result, trials, logged, shape_gib)}
    return _judge(out, logged, expected_drop=logged,
                  not_logged=f"{plan} was asked, but the engine's load log has no PrefetchOffloader line: no "
                  "layer left the GPU",
                  asked=f"{logged or 0:.2f} GiB of layers the engine logged as offloaded",
                  held=f"prefetch logged {logged or 0:.2f} GiB of layers offloaded")


def _judge(out: dict[str, Any], logged: float | None, expected_drop: float | None, not_logged: str, asked: str,
           held: str) -> dict[str, Any]:
    """The verdict on both kinds of offload: the engine must log the offload, and the weights' footprint on
    the GPU must drop against a comparable trial without offload by at least a share of what it should."""
    loaded, ref_gib = out["model_load_gib"], out["reference_model_load_gib"]
    if logged is None or expected_drop is None:
        out.update(verified=False, reason=not_logged)
    elif not isinstance(loaded, int | float) or not isinstance(ref_gib, int | float):
        out.update(verified=None, reason="no weights footprint to compare with (no trial without offload "
                   "logged one, and the model's shape, where known, does not account for the footprint and the "
                   "logged offload)")
    elif ref_gib - loaded < MIN_DROP_SHARE * expected_drop:
        out.update(verified=False, reason=f"weights take {loaded:.2f} GiB on the GPU, against {ref_gib:.2f} GiB "
                   f"without offload ({_source(out)}): the footprint did not drop by the {asked}")
    else:
        out.update(verified=True, reason=f"{held}; weights {loaded:.2f} GiB on the GPU against {ref_gib:.2f} GiB "
                   f"without offload ({_source(out)})")
    return out


def _source(out: dict[str, Any]) -> str:
    trial = out.get("reference_trial")
    return f"trial {trial}" if trial is not None else str(out.get("reference", "the model's shape"))
