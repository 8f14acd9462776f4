"""What production served between two snapshots of one engine lifetime: the request rate, the prompt and
output lengths, and the latencies its requests saw, each as the window's own histogram.

This is the twin's evidence of the box with no downtime (twin/production.py): the config production runs,
under the load it really had. A window spans one engine lifetime and one model: a counter that went back
(a restart), another model or a changed bucket layout is no window. Our own traffic (the daemon's verify
and soak prompts) is kept out by the caller, which drops snapshots taken before it settled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotuner.watch.snapshot import LengthHistogram, ProductionSnapshot

# Fewer finished requests than this say little of a p50 (and nothing of the rate).
MIN_REQUESTS = 20
HISTOGRAMS = ("prompt_tokens", "generation_tokens", "ttft_s", "itl_s")


@dataclass(frozen=True)
class ServedWindow:
    start: float  # time.time() of the older snapshot
    end: float
    model: str | None  # /v1/models root: the model the window's requests ran on
    max_model_len: int | None
    prompt_tokens: LengthHistogram
    generation_tokens: LengthHistogram
    ttft_s: LengthHistogram
    itl_s: LengthHistogram
    # Engine seconds per wall second: 1 for vLLM; `autotuner sim serve` runs faster (its /version says by
    # how much) and its latencies are in its own seconds, so its rates must be too.
    speedup: float = 1.0

    @property
    def duration_s(self) -> float:
        """In the engine's seconds, as its latencies are."""
        return (self.end - self.start) * self.speedup

    @property
    def requests(self) -> int:
        return int(self.generation_tokens.count)

    @property
    def request_rate(self) -> float:
        return self.generation_tokens.count / self.duration_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.generation_tokens.sum / self.duration_s

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "model": self.model, "max_model_len": self.max_model_len,
                **{name: getattr(self, name).as_dict() for name in HISTOGRAMS}, "speedup": self.speedup}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServedWindow:
        mml = data.get("max_model_len")
        return cls(float(data["start"]), float(data["end"]), data.get("model"),
                   int(mml) if isinstance(mml, int) else None,
                   *(LengthHistogram.from_dict(data[name]) for name in HISTOGRAMS), float(data.get("speedup") or 1.0))


def same_lifetime(older: ProductionSnapshot, newer: ProductionSnapshot) -> bool:
    """Whether the two snapshots' counts belong to one engine lifetime serving one model."""
    if not (older.reachable and newer.reachable) or newer.taken_at <= older.taken_at:
        return False
    if older.model_fingerprint != newer.model_fingerprint or older.root != newer.root:
        return False
    for name in HISTOGRAMS:
        a, b = getattr(older, name), getattr(newer, name)
        if a is None or b is None or (b.since(a) is b and a.count > 0):  # since() gave up: restart, new layout
            return False
    return True


def served_window(older: ProductionSnapshot, newer: ProductionSnapshot,
                  min_requests: int = MIN_REQUESTS) -> ServedWindow | None:
    """The window from `older` to `newer`, or None where they do not make one (not the same lifetime and
    model, a histogram missing, too few requests finished between them)."""
    if not same_lifetime(older, newer):
        return None
    prompts, outputs, ttft, itl = (getattr(newer, name).since(getattr(older, name)) for name in HISTOGRAMS)
    if outputs.count < max(1, min_requests) or ttft.count < max(1, min_requests) or itl.count < 1:
        return None
    speedup = (newer.simulator or {}).get("speedup")
    return ServedWindow(older.taken_at, newer.taken_at, newer.root, newer.max_model_len, prompts, outputs, ttft, itl,
                        float(speedup) if isinstance(speedup, int | float) and speedup > 0 else 1.0)
