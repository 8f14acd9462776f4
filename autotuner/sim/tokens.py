"""The simulator's stand-in for a tokenizer: deterministic, documented, cheap.

Scheme (what `/tokenize` and `usage.prompt_tokens` count):
- text is split at whitespace into words; a word of n characters is ceil(n / 4) tokens, one per
  4-character piece; whitespace itself is free. Token id = crc32(piece) mod vocab_size.
- a prompt given as a list of integers is taken as token ids as they are.
- chat messages are rendered ChatML-style, `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message,
  plus `<|im_start|>assistant\\n` for the generation prompt, then counted as text.
- generated text is made of 4-letter words with a leading space, one token each, so that the text
  of n completion tokens counts as n tokens again.
- without `ignore_eos`, the simulated model emits EOS after `natural_output_len` tokens: a length
  in 16..512 drawn from a hash of the prompt and the seed (the same request always stops at the
  same place).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping

_WORD = re.compile(r"\S+")
PIECE_CHARS = 4
OUTPUT_WORDS = (
    "time", "data", "flow", "fast", "load", "tune", "rank", "core", "step", "byte",
    "page", "pool", "fuse", "warp", "gate", "norm", "rope", "head", "loop", "sort",
)  # fmt: skip


def encode(text: str, vocab_size: int) -> list[int]:
    ids: list[int] = []
    crc = zlib.crc32
    for word in _WORD.findall(text):
        if len(word) <= PIECE_CHARS:  # the common case: one piece
            ids.append(crc(word.encode()) % vocab_size)
            continue
        for i in range(0, len(word), PIECE_CHARS):
            ids.append(crc(word[i : i + PIECE_CHARS].encode()) % vocab_size)
    return ids


def count(text: str) -> int:
    return sum(-(-len(w) // PIECE_CHARS) for w in _WORD.findall(text))


def render_chat(messages: Iterable[Mapping[str, object]], add_generation_prompt: bool = True) -> str:
    parts = []
    for message in messages:
        content = message.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def output_word(request_key: int, index: int) -> str:
    return " " + OUTPUT_WORDS[(request_key + 7 * index) % len(OUTPUT_WORDS)]


def natural_output_len(prompt: list[int], seed: int) -> int:
    key = zlib.crc32(repr((seed, len(prompt), prompt[:32], prompt[-32:])).encode())
    return 16 + key % 497
