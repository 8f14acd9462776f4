"""One request to send: what the replayer and the client share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestSpec:
    """Exactly one of `prompt` (completions API) or `messages` (chat API) is set.

    `arrival_s` is the trace's offset from the start in engine seconds (None for synthetic
    requests, whose schedule comes from the arrival process); `target_prompt_tokens` is the length
    the synthetic builder aimed at (None for traces).
    """

    prompt: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int
    arrival_s: float | None = None
    target_prompt_tokens: int | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None
