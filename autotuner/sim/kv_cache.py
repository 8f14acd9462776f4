"""Paged KV blocks with prefix caching, shaped like vLLM V1's block pool.

A block is referenced by the requests using it; a freed block keeps its content hash and stays
findable until it is reused (least recently freed first), which is what makes prefix caching work.
Block 0 is vLLM's reserved null block and is never handed out.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        # Free blocks in eviction order; cached-but-unused blocks are free too.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._hash_of: dict[int, int] = {}
        self._cached: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by requests (vllm:kv_cache_usage_perc)."""
        usable = self.num_blocks - 1
        return 0.0 if usable <= 0 else 1.0 - len(self._free) / usable

    def lookup(self, hashes: list[int]) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes`; referenced for the caller."""
        if not self.enable_caching:
            return []
        hits: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
        return hits

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        out: list[int] = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block, None)
            if old is not None and self._cached.get(old) == block:
                del self._cached[old]
            self._ref[block] = 1
            out.append(block)
        return out

    def release(self, blocks: list[int]) -> None:
        # Tail blocks first, so that a prefix outlives its suffix in the cache (as vLLM does).
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def register(self, block: int, content_hash: int) -> None:
        """Mark a full block's content as reusable by later requests with the same prefix."""
        if self.enable_caching and block not in self._hash_of and content_hash not in self._cached:
            self._hash_of[block] = content_hash
            self._cached[content_hash] = block


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of `tokens`: equal only when the whole prefix is equal."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out
