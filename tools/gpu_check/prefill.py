"""vLLM V1's chunked prefill as the wall step feeds it to the device: which tokens of which prompt
each engine step takes under a token budget.
"""

from __future__ import annotations

from collections.abc import Iterator

# One prefill step: (slot offset in the KV tensor, first position, new tokens) per sequence.
Chunk = tuple[int, int, int]


def schedule_chunks(prompts: tuple[int, ...], budget: int) -> list[list[Chunk]]:
    """vLLM V1's chunked prefill of prompts that all arrive at once: each step takes up to `budget`
    tokens, first-come first-served, finishing the partly prefilled prompt before starting the next."""
    offsets = [sum(prompts[:i]) for i in range(len(prompts))]
    done = [0] * len(prompts)
    steps: list[list[Chunk]] = []
    while any(d < p for d, p in zip(done, prompts, strict=True)):
        left, step = budget, []
        for i, length in enumerate(prompts):
            n = min(length - done[i], left)
            if n <= 0:
                continue
            step.append((offsets[i], done[i], n))
            done[i] += n
            left -= n
            if left == 0:
                break
        steps.append(step)
    return steps


def last_token_rows(chunks: list[Chunk]) -> Iterator[int]:
    """The row of each chunk's last token in the engine step's concatenated tokens (where the sampler reads)."""
    o = 0
    for _, _, n in chunks:
        o += n
        yield o - 1
