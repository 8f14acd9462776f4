"""Workload spec → the list of requests to send.

Synthetic prompts start with a prefix unique to each request (an encoded index among the first
tokens): vLLM's prefix cache hashes whole blocks chained from the start, so one differing token in
the first block means no request reuses another's KV cache and results are not flattered. A
`shared_prefix_fraction` of requests instead begins with one common `shared_prefix_tokens`-token
prefix before its unique part, to model system prompts or few-shot headers on purpose.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import structlog

from autotuner.workload.calibration import (
    ANCHOR,
    Calibration,
    TokenCounter,
    TokenizeUnavailableError,
    calibrate,
    estimated_calibration,
)
from autotuner.workload.request_spec import RequestSpec
from autotuner.workload.spec import SyntheticRequests, TraceRequests, WorkloadSpec
from autotuner.workload.trace import TraceError, load_trace, replayed

__all__ = ["PromptBuilder", "RequestSet", "RequestSpec", "TraceError", "build_requests", "build_synthetic"]

log = structlog.get_logger(__name__)

FILLER_CYCLE = 4096  # filler words drawn once; each prompt reads them from its own random offset
MARKER_SPACE = 10**6  # distinct unique prefixes before they could repeat within one seed
VERIFY_SAMPLES = 3
FIXUP_ROUNDS = 3
FIXUP_PARALLEL = 16


@dataclass(frozen=True)
class RequestSet:
    """The requests (warm-up ones first) and how their prompt lengths were obtained."""

    requests: list[RequestSpec]
    warmup: int
    calibration: Calibration | None = None  # None for traces
    tokenize_calls: int = 0
    warnings: list[str] = field(default_factory=list)


class PromptBuilder:
    """Prompts of an exact token count under a calibration (words of cost one fill the rest)."""

    def __init__(self, calibration: Calibration, seed: int) -> None:
        self.cal = calibration
        costs = calibration.word_cost
        cheapest = min(costs.values())
        # Fillers and markers use only the cheapest words, so any count above the minimum is reachable
        # (exactly, when those cost one token: the usual case).
        self.units = sorted(w for w, c in costs.items() if c == cheapest)
        self.unit_cost = cheapest
        rng = random.Random(f"{seed}-text")
        self._filler = [rng.choice(self.units) for _ in range(FILLER_CYCLE)]
        self.marker_words = max(2, math.ceil(math.log(MARKER_SPACE, len(self.units)))) if len(self.units) > 1 \
            else 1
        self._marker_offset = rng.randrange(len(self.units) ** self.marker_words)
        self._shared_rng = random.Random(f"{seed}-shared")

    def marker(self, index: int) -> list[str]:
        n, base = index + self._marker_offset, len(self.units)
        digits = []
        for _ in range(self.marker_words):
            n, d = divmod(n, base)
            digits.append(self.units[d])
        return digits

    def shared_prefix(self, tokens: int, chat: bool) -> list[str]:
        n = max(0, tokens - self.cal.base(chat)) // self.unit_cost
        return [self._shared_rng.choice(self.units) for _ in range(n)]

    def min_tokens(self, shared: list[str], chat: bool) -> int:
        return self.cal.base(chat) + (len(shared) + self.marker_words) * self.unit_cost

    def words(self, index: int, target: int, shared: list[str], chat: bool, offset: int) -> list[str]:
        fill = max(0, target - self.min_tokens(shared, chat)) // self.unit_cost
        reps = (offset + fill) // FILLER_CYCLE + 1
        return [*shared, *self.marker(index), *(self._filler * reps)[offset : offset + fill]]

    def request(self, words: list[str], chat: bool, max_tokens: int, target: int) -> RequestSpec:
        text = " ".join([ANCHOR, *words])
        if chat:
            return RequestSpec(None, [{"role": "user", "content": text}], max_tokens, None, target)
        return RequestSpec(text, None, max_tokens, None, target)


def build_synthetic(syn: SyntheticRequests, total: int, calibration: Calibration, seed: int,
                    warmup: int = 0, replay: int = 0) -> list[RequestSpec]:
    """`total` requests; lengths drawn in a fixed order from one seeded stream (reproducible). The first
    measured ones (after `warmup`) have `syn.include_prompt_tokens`' lengths: measured, so that a request
    of theirs that fails fails the run; the warm-up stays drawn, as it is only there to warm the engine.
    `replay` k (the k-th replay on one running engine) keeps every length and arrival but gives each
    prompt a unique prefix of its own: a replay of the very same prompts would find their KV blocks in
    the prefix cache and measure a flattered engine."""
    chat = syn.api == "chat"
    builder = PromptBuilder(calibration, seed)
    shared = builder.shared_prefix(syn.shared_prefix_tokens, chat) if syn.shared_prefix_tokens else []
    rng = random.Random(seed)
    included = syn.include_prompt_tokens
    out = []
    for i in range(total):
        target = syn.prompt_tokens.sample(rng)  # drawn even when replaced: the rest stay as without the list
        if 0 <= i - warmup < len(included):
            target = included[i - warmup]
        max_tokens = syn.output_tokens.sample(rng)
        use_shared = shared if shared and rng.random() < syn.shared_prefix_fraction else []
        offset = rng.randrange(FILLER_CYCLE)
        # A target below the fixed part (anchor, shared prefix, unique marker) cannot be met: the
        # request records the length it really aims at.
        target = max(target, builder.min_tokens(use_shared, chat))
        words = builder.words(replay * total + i, target, use_shared, chat, offset)
        out.append(builder.request(words, chat, max_tokens, target))
    return out


def fresh_replay() -> int:
    """A replay index no earlier call on the same engine is likely to have used (one in MARKER_SPACE per
    prompt): for a check that may run again against a server that keeps its prefix cache."""
    return secrets.randbelow(MARKER_SPACE)


async def build_requests(spec: WorkloadSpec, http: httpx.AsyncClient, base_url: str, model: str,
                         api_key: str | None = None, replay: int = 0) -> RequestSet:
    """Raises TraceError (a ValueError) for a bad trace; tokenizer trouble other than a missing
    endpoint surfaces as `calibration.TokenizeError`. `replay`: see `build_synthetic` (a trace's prompts
    open with a marker of the replay instead: `trace.replayed`)."""
    if isinstance(spec.requests, TraceRequests):
        reqs = replayed(load_trace(spec.requests.path, require_arrival=spec.arrivals.kind == "trace"), replay)
        return RequestSet(reqs, min(spec.warmup_requests, len(reqs)))
    syn = spec.requests
    chat = syn.api == "chat"
    counter = TokenCounter(http, base_url, model, api_key)
    warnings: list[str] = []
    try:
        cal = await calibrate(counter, chat)
    except TokenizeUnavailableError:
        cal = estimated_calibration(chat)
        warnings.append(f"{base_url} has no /tokenize: prompt lengths are estimated at "
                        "~4 characters per token and may be off by a good margin")
        log.warning("workload.tokenize_unavailable", base_url=base_url)
    total = spec.warmup_requests + syn.measured
    reqs = build_synthetic(syn, total, cal, spec.seed, warmup=spec.warmup_requests, replay=replay)
    if not cal.estimated:
        reqs, note = await _verify(reqs, counter, random.Random(f"{spec.seed}-verify"))
        if note:
            warnings.append(note)
            log.warning("workload.prompt_lengths_not_additive", detail=note)
    return RequestSet(reqs, spec.warmup_requests, cal, counter.calls, warnings)


async def _count(counter: TokenCounter, req: RequestSpec) -> int:
    if req.messages is not None:
        return await counter.count_messages(req.messages)
    return await counter.count_text(req.prompt or "")


async def _verify(reqs: list[RequestSpec], counter: TokenCounter,
                  rng: random.Random) -> tuple[list[RequestSpec], str | None]:
    """Check a few prompts exactly (the longest among them, where drift would be largest); if the
    tokenizer is not additive after all, measure and fix every prompt (a few calls each)."""
    longest = max(range(len(reqs)), key=lambda i: reqs[i].target_prompt_tokens or 0)
    picks = sorted({0, longest, *rng.sample(range(len(reqs)), min(VERIFY_SAMPLES, len(reqs)))})
    counts = await asyncio.gather(*(_count(counter, reqs[i]) for i in picks))
    off = [(reqs[i].target_prompt_tokens, n) for i, n in zip(picks, counts, strict=True)
           if n != reqs[i].target_prompt_tokens]
    if not off:
        return reqs, None
    gate = asyncio.Semaphore(FIXUP_PARALLEL)

    async def fix(req: RequestSpec) -> RequestSpec:
        async with gate:
            target = req.target_prompt_tokens or 0
            n = await _count(counter, req)
            best = (abs(target - n), req)
            for _ in range(FIXUP_ROUNDS):
                if n == target:
                    break
                req = _resize(req, target - n)
                n = await _count(counter, req)
                # A word that crosses a merge boundary can make the steps oscillate: keep the closest.
                best = min(best, (abs(target - n), req), key=lambda b: b[0])
            return best[1], best[0] == 0

    fixed = await asyncio.gather(*(fix(r) for r in reqs))
    missed = sum(not exact for _, exact in fixed)
    note = (f"prompt token counts were not additive (target→measured: {off[:3]}); every prompt was "
            f"measured and adjusted with /tokenize ({counter.calls} calls in all)"
            + (f"; {missed} still off their target" if missed else ""))
    return [r for r, _ in fixed], note


def _resize(req: RequestSpec, delta_words: int) -> RequestSpec:
    """Add (>0) or drop (<0) trailing filler words, never into the anchor and marker."""
    def apply(text: str) -> str:
        words = text.split(" ")
        if delta_words > 0:
            return text + " " + " ".join([words[-1]] * delta_words)
        keep = max(2, len(words) + delta_words)
        return " ".join(words[:keep])

    if req.messages is not None:
        msgs: list[dict[str, Any]] = [dict(m) for m in req.messages]
        msgs[-1]["content"] = apply(str(msgs[-1]["content"]))
        return replace(req, messages=msgs)
    return replace(req, prompt=apply(req.prompt or ""))
