"""Token costs of the synthetic prompts' words, measured once against the server's own tokenizer.

Prompts are built from a pool of short common words after a fixed anchor word. With a BPE or
SentencePiece tokenizer a space-separated word is tokenized on its own (pre-tokenization splits at
spaces), so a prompt's count is additive: cost(anchor) + Σ cost(word). Each word costs at least one
token, so if the whole pool costs exactly as many tokens as it has words, every word costs one: the
usual case needs two `/tokenize` calls. Otherwise the pool is halved recursively (group testing) down
to the one-token words, until enough of them are known: a few more calls. The builder then verifies
a sample of finished prompts.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

from autotuner.errors import AutotunerError

ANCHOR = "Context:"
WORD_POOL = (
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one",
    "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two",
    "way", "who", "did", "its", "let", "put", "say", "she", "too", "use", "that", "with", "have",
    "this", "will", "your", "from", "they", "know", "want", "been", "good", "much", "some", "time",
    "very", "when", "come", "here", "just", "like", "long", "make", "many", "more", "only", "over",
    "such", "take", "than", "them", "well", "were", "what", "year", "back", "call", "city", "each",
    "find", "give", "hand", "high", "keep", "last", "left", "life", "line", "most", "move", "must",
    "name", "need", "next", "open", "part", "play", "read", "room", "same", "show", "side", "tell",
    "turn", "walk", "word", "work",
)  # fmt: skip
CHARS_PER_TOKEN = 4  # the fallback estimate when the server has no /tokenize
ENOUGH_UNIT_WORDS = 32  # one-token words to stop searching at (fillers and unique markers)
FALLBACK_CHAT_OVERHEAD = 12  # tokens of a typical chat template around one user message (est.)
TOKENIZE_TIMEOUT_S = 30.0  # a replay's client has no read timeout; calibration must not hang on it


class TokenizeUnavailableError(AutotunerError):
    """The server has no /tokenize endpoint (HTTP 404 from the router, not a wrong model)."""


class TokenizeError(AutotunerError):
    """/tokenize answered with an error other than a missing endpoint."""


class TokenCounter:
    """`POST /tokenize` as vLLM (and the simulator) serve it: `{"count": n, ...}`."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, model: str, api_key: str | None = None) -> None:
        self._http = http
        self._url = base_url.rstrip("/") + "/tokenize"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.calls = 0  # round trips made, so tests can hold the calibration to its budget

    async def count_text(self, text: str) -> int:
        return await self._count({"model": self._model, "prompt": text})

    async def count_messages(self, messages: list[dict[str, Any]]) -> int:
        return await self._count({"model": self._model, "messages": messages})

    async def _count(self, body: dict[str, Any]) -> int:
        self.calls += 1
        try:
            resp = await self._http.post(self._url, json=body, headers=self._headers, timeout=TOKENIZE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise TokenizeError(f"POST {self._url}: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404 and "does not exist" not in resp.text:
            raise TokenizeUnavailableError(f"POST {self._url} → 404")
        if resp.status_code >= 400:
            raise TokenizeError(f"POST {self._url} → HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            count = resp.json()["count"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise TokenizeError(f"POST {self._url}: no `count` in {resp.text[:200]!r}") from None
        return int(count)


@dataclass(frozen=True)
class Calibration:
    """Token costs for building prompts: a prompt `ANCHOR word word …` costs
    `base_tokens + Σ word_cost` (completions) or `chat_base_tokens + Σ word_cost` (one user message)."""

    word_cost: dict[str, int]
    base_tokens: int
    chat_base_tokens: int | None
    estimated: bool  # True: no /tokenize, costs are a chars-per-token guess

    def base(self, chat: bool) -> int:
        if chat:
            assert self.chat_base_tokens is not None, "calibrated without chat"
            return self.chat_base_tokens
        return self.base_tokens


def estimated_calibration(chat: bool) -> Calibration:
    """~4 characters per token, one more for BOS; used only when the server cannot count."""
    costs = {w: max(1, round((len(w) + 1) / CHARS_PER_TOKEN)) for w in WORD_POOL}
    base = 1 + max(1, round(len(ANCHOR) / CHARS_PER_TOKEN))
    return Calibration(costs, base, base + FALLBACK_CHAT_OVERHEAD if chat else None, estimated=True)


async def calibrate(counter: TokenCounter, chat: bool) -> Calibration:
    """Raises TokenizeUnavailableError when the server has no /tokenize (the caller falls back)."""
    base = await counter.count_text(ANCHOR)
    costs: dict[str, int] = {}

    async def group_cost(words: tuple[str, ...]) -> int:
        return await counter.count_text(ANCHOR + " " + " ".join(words)) - base

    async def resolve(words: tuple[str, ...], cost: int) -> None:
        if cost == len(words):
            costs.update(dict.fromkeys(words, 1))
            return
        if len(words) == 1:
            if cost >= 1:  # a word that costs nothing breaks additivity: leave it out
                costs[words[0]] = cost
            return
        if sum(c == 1 for c in costs.values()) >= ENOUGH_UNIT_WORDS:
            return  # prompts are built from one-token words only: the other costs are not needed
        half = len(words) // 2
        left = await group_cost(words[:half])
        # The right half's cost follows from additivity: one call per split, not two.
        await asyncio.gather(resolve(words[:half], left), resolve(words[half:], cost - left))

    await resolve(WORD_POOL, await group_cost(WORD_POOL))
    chat_base = None
    if chat:
        chat_base = await counter.count_messages([{"role": "user", "content": ANCHOR}])
    return Calibration(costs, base, chat_base, estimated=False)
