"""Prefix affinity's memory: which worker last served each prompt block, bounded, local to one router.

Block hashes are a chain over fixed-size blocks of the tokenised prompt: hash i covers tokens
0..(i+1) * block_tokens, so two prompts share hash i exactly when they share those leading tokens, and the
first divergent block changes every hash after it. Only full blocks are hashed (a partial last block is
still being extended by the conversation). The chain starts from the model's name, so the same text sent
to two models never shares an entry.

`PrefixIndex` maps block hash -> the worker that last served it, least recently used dropped first past
`max_blocks` entries. A dispatch records every block of its prompt, deepest first, so a chain's leading
blocks are the most recent and its tail is evicted before its head (as the workers' radix caches evict
leaves first). `match` answers with a frozen `PrefixMatch`, which placement reads; placement never sees
the index itself and stays a pure function.

The index lives in one router process: with several routers (state.backend = redis) each learns only
the conversations it routed; a turn that comes in through another router places without affinity.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HASH_BYTES = 8


def chain_hashes(payloads: Iterable[bytes], salt: bytes = b"") -> tuple[int, ...]:
    """h_i = H(h_{i-1} || payload_i), h_{-1} = H(salt): each hash stands for every payload up to it."""
    prev = hashlib.blake2b(salt, digest_size=HASH_BYTES).digest()
    out = []
    for payload in payloads:
        prev = hashlib.blake2b(prev + payload, digest_size=HASH_BYTES).digest()
        out.append(int.from_bytes(prev, "little"))
    return tuple(out)


def block_hashes(token_ids: Sequence[int], block_tokens: int, salt: bytes = b"") -> tuple[int, ...]:
    """The chain hashes of the prompt's full `block_tokens`-token blocks (module doc)."""
    full = len(token_ids) // block_tokens
    ids = array("I", token_ids[: full * block_tokens])  # ids are range-checked against the vocabulary
    step = block_tokens * ids.itemsize
    raw = ids.tobytes()
    return chain_hashes((raw[i * step : (i + 1) * step] for i in range(full)), salt)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """For one request: how many of its leading blocks each worker last served (deepest match wins).

    A worker that last served block i served the whole prefix up to it (hash chains), so its match is
    i + 1 blocks even where another worker served a shorter shared prefix later."""

    blocks: int  # the request's full blocks
    served_blocks: tuple[tuple[str, int], ...] = ()  # (worker_id, leading blocks), sorted by worker_id

    def served(self, worker_id: str) -> int:
        """The request's leading blocks `worker_id` last served."""
        for wid, n in self.served_blocks:
            if wid == worker_id:
                return n
        return 0

    def fraction(self, worker_id: str) -> float:
        """The fraction of the request's leading blocks `worker_id` last served, in [0, 1]."""
        return self.served(worker_id) / self.blocks if self.blocks > 0 else 0.0


class PrefixIndex:
    """Block hash -> worker that last served it; LRU past `max_blocks` entries (module doc)."""

    def __init__(self, max_blocks: int, block_tokens: int) -> None:
        if max_blocks <= 0 or block_tokens <= 0:
            raise ValueError("PrefixIndex needs max_blocks > 0 and block_tokens > 0")
        self.max_blocks, self.block_tokens = max_blocks, block_tokens
        self._owner: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def hashes(self, token_ids: Sequence[int], model: str) -> tuple[int, ...]:
        return block_hashes(token_ids, self.block_tokens, model.encode())

    def match(self, hashes: Sequence[int]) -> PrefixMatch:
        """Who served the request's leading blocks; the walk stops at the first block nobody served
        (no later block of the chain can be known: its hash covers the divergent one)."""
        deepest: dict[str, int] = {}
        for i, h in enumerate(hashes):
            wid = self._owner.get(h)
            if wid is None:
                break
            deepest[wid] = i + 1
        return PrefixMatch(len(hashes), tuple(sorted(deepest.items())))

    def record(self, hashes: Sequence[int], worker_id: str) -> None:
        """`worker_id` now holds these blocks: deepest first, so the head is the most recently used."""
        for h in reversed(hashes):
            self._owner[h] = worker_id
            self._owner.move_to_end(h)
        while len(self._owner) > self.max_blocks:
            self._owner.popitem(last=False)
