"""One simulated worker's KV memory: blocks held by running requests, a radix-style prefix cache of the rest.

Units are KV tokens of the worker's own pool (virtual token slots under compression for a zipkv worker).
A running request pins its prompt's 512-token blocks (refcounted: two requests sharing a prefix hold its
blocks once) and reserves its whole output (prompt + max_new is held until it finishes, so no request is
ever retracted; the same rule for every system). When it finishes its blocks stay cached (evictable,
least recently used first), as SGLang's radix cache keeps them; cached blocks count as free memory.
A new request reuses the longest run of its leading blocks that is cached (pinned or evictable) and
prefills the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class Blocks(Protocol):
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def block_ids(self) -> tuple[int, ...]: ...

    def block_tokens(self, k: int) -> int: ...


class KvCache:
    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"KV capacity must be > 0 tokens, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self._pins: dict[int, int] = {}  # block id -> running requests holding it
        self._size: dict[int, int] = {}  # block id -> its tokens (pinned or cached)
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable blocks, oldest first
        self.pinned_tokens = 0
        self.cached_tokens = 0  # evictable
        self.reserved_tokens = 0  # outputs of running requests, held from admission

    @property
    def free_tokens(self) -> int:
        """What a new request may take: everything not pinned or reserved (cached blocks are reclaimable)."""
        return self.capacity_tokens - self.pinned_tokens - self.reserved_tokens

    @property
    def used_tokens(self) -> int:
        return self.pinned_tokens + self.reserved_tokens

    def cached_prefix(self, req: Blocks) -> tuple[int, int]:
        """(blocks, tokens) of the request's longest cached leading run."""
        tokens = 0
        for k, b in enumerate(req.block_ids):
            if b not in self._size:
                return k, tokens
            tokens += req.block_tokens(k)
        return len(req.block_ids), tokens

    def need_tokens(self, req: Blocks) -> int:
        """New memory the request takes if admitted now: blocks not pinned by another request + its output."""
        new = sum(req.block_tokens(k) for k, b in enumerate(req.block_ids) if b not in self._pins)
        return new + req.output_tokens

    def fits(self, req: Blocks) -> bool:
        return self.need_tokens(req) <= self.free_tokens

    def admit(self, req: Blocks) -> int:
        """Pin the request's blocks and reserve its output; returns the prompt tokens to prefill."""
        _, hit_tokens = self.cached_prefix(req)
        for k, b in enumerate(req.block_ids):
            if b in self._pins:
                self._pins[b] += 1
                continue
            if b in self._lru:
                del self._lru[b]
                size = self._size[b]
                self.cached_tokens -= size
            else:
                size = self._size[b] = req.block_tokens(k)
            self._pins[b] = 1
            self.pinned_tokens += size
        self.reserved_tokens += req.output_tokens
        self._evict()
        return req.input_tokens - hit_tokens

    def release(self, req: Blocks) -> None:
        """The request finished: its output reservation goes, its blocks become cached (most recent last)."""
        self.reserved_tokens -= req.output_tokens
        for b in reversed(req.block_ids):  # the last block first: the oldest, evicted first (a leaf)
            left = self._pins[b] - 1
            if left:
                self._pins[b] = left
                continue
            del self._pins[b]
            size = self._size[b]
            self.pinned_tokens -= size
            self.cached_tokens += size
            self._lru[b] = None
        self._evict()

    def _evict(self) -> None:
        while self._lru and self.used_tokens + self.cached_tokens > self.capacity_tokens:
            b, _ = self._lru.popitem(last=False)
            self.cached_tokens -= self._size.pop(b)
