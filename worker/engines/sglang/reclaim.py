"""Room from SGLang's prefix cache (radix cache) when its pages are compressed.

SGLang counts the radix cache's evictable tokens as free room one for one: admission checks
``available_size() + evictable_size()``, and before an allocation it evicts only the shortfall
(``evict_from_tree_cache``). With zipkv a cached page is compressed, so evicting it gives back its stored
bytes (at least the format's all-compressed page, 3/4 of a raw page in v1/v2 and v3 alike, and only once
the chunks it sat in are empty or compacted), not a whole raw page. Left alone, admission over-promises
and an allocation after the shortfall eviction can still fail, which SGLang turns into "Prefill out of
memory" (seen in a milestone-3 run's counters going below zero on the H200).

Two parts, both active only while a radix cache is wired in (`PrefixCache`):
- `overcount_tokens`: what ``available_size()`` holds back so that SGLang's available + evictable never
  promises more than evicting can give (a quarter of the evictable tokens, whole pages), except the pages
  the next decode step needs (allocator.py: SGLang's decode check evicts only its shortfall);
- `reclaim`: when an allocation finds no room, evict more of the cache (doubling each round), let the pool
  apply the frees and compact, wait for the device, and look again; a few rounds, then give up (the
  allocation fails as before).
`decode_room` serves SGLang's decode check (with or without a cache): the room it looks for may only be late.
No sglang import: seams.py wires a `PrefixCache` over the scheduler's tree cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from zipkv.allocator import PagePool
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat

RECLAIM_ROUNDS = 8  # evicting up to 255x the first round's shortfall
RECLAIM_COMPACTION_PASSES = 64  # per round; each pass moves at most ledger.COMPACTION_MAX_PAGES pages
RECLAIM_LIVE_FRACTION = 0.99  # under pressure, compact any chunk whose dead bytes could make room


class Reclaimer(Protocol):
    """What reclaiming needs of zipkv's SGLang allocator (allocator.ZipkvAllocator). Under tensor
    parallelism every look at the headroom is an agreement of the ranks (`refresh_headroom`, then
    `headroom_pages`), and so is whether compaction still moved pages (`max_over_ranks`): each rank
    evicts from its copy of the same prefix cache, so they must evict alike (rank_agreement.py)."""

    @property
    def pool(self) -> PagePool: ...

    def headroom_pages(self) -> int: ...

    def refresh_headroom(self) -> None: ...

    def max_over_ranks(self, value: int) -> int: ...

    def drain(self, block: bool) -> None: ...


@dataclass(frozen=True)
class PrefixCache:
    """SGLang's radix cache as the allocator sees it."""

    evictable_tokens: Callable[[], int]  # tree_cache.evictable_size()
    evict_tokens: Callable[[int], int]  # evict at least n tokens if it can; returns tokens evicted


def min_stored_share(fmt: PageFormat) -> tuple[int, int]:
    """The least share of a raw page a compressed page is stored in, as an exact fraction: every block
    compressed (v1/v2 768 of 1024 bytes a block, v3 192 of 256; v3's patches and raw pages only add)."""
    return fmt.min_page_bytes, fmt.raw_page_bytes


def overcount_tokens(evictable_tokens: int, fmt: PageFormat) -> int:
    """Tokens SGLang over-counts when it treats ``evictable_tokens`` compressed tokens as free: the share
    of each page that evicting may not give back, rounded up to whole pages."""
    share_num, share_den = min_stored_share(fmt)
    pages = -(-evictable_tokens // PAGE_TOKENS)
    return -(-pages * (share_den - share_num) // share_den) * PAGE_TOKENS


@dataclass(frozen=True)
class ReclaimOutcome:
    """What one reclaim did: enough to tell, from a log line, why an allocation still failed."""

    fit: bool  # need_pages fit afterwards
    rounds: int  # eviction rounds run
    evicted_tokens: int  # tokens the prefix cache evicted, all rounds
    moved_pages: int  # pages compaction moved, all rounds
    headroom_pages: int  # what fits afterwards
    evictable_tokens: int  # what the prefix cache still holds evictable afterwards


def reclaim(alloc: Reclaimer, cache: PrefixCache, need_pages: int, looked: bool = False) -> ReclaimOutcome:
    """Make room for ``need_pages`` new pages from the prefix cache; ``fit`` once they fit. ``looked``: the
    caller has just refreshed the headroom and nothing changed since, so the first round takes that look.

    Each round evicts twice what the round before did: evicted pages that share chunks with live ones give
    their bytes back only through compaction, so the shortfall alone can leave the pool short round after
    round (seen on the H100 trace sweep: "Prefill out of memory" with 340k evictable tokens left). Under
    tensor parallelism each look is a collective (rank_agreement.py), so a look still current is not
    taken again; every rank skips alike, since what decides it was decided on agreed numbers."""
    share_num, share_den = min_stored_share(alloc.pool.fmt)
    scale, rounds, evicted_total, moved_total = 1, 0, 0, 0
    for _ in range(RECLAIM_ROUNDS):
        if not looked:
            alloc.refresh_headroom()
        looked = True
        fit = alloc.headroom_pages()
        if fit >= need_pages:
            break
        rounds += 1
        # evict enough that even fully compressed pages cover the shortfall, times the round's scale
        want_tokens = -(-(need_pages - fit) * share_den // share_num) * PAGE_TOKENS * scale
        evicted = cache.evict_tokens(want_tokens) if cache.evictable_tokens() > 0 else 0
        alloc.drain(block=True)  # the evicted pages' frees land in the pool
        moved, looked = _compact(alloc, need_pages)  # waits for the device: drained chunks, moves taken in
        evicted_total += evicted
        moved_total += moved
        if evicted == 0 and moved == 0:
            break
        scale *= 2
    if not looked:
        alloc.refresh_headroom()
    headroom = alloc.headroom_pages()
    return ReclaimOutcome(
        fit=headroom >= need_pages,
        rounds=rounds,
        evicted_tokens=evicted_total,
        moved_pages=moved_total,
        headroom_pages=headroom,
        evictable_tokens=cache.evictable_tokens(),
    )


def decode_room(alloc: Reclaimer, cache: PrefixCache | None, need_pages: int) -> None:
    """SGLang's decode check found fewer than ``need_pages`` free: before it retracts requests, take in what
    is only late, then reclaim (the caller looks again, in SGLang's terms). Frees are applied once their
    device copy lands and a prefill's raw pages shrink once its encode's sizes land, both a forward step
    behind the scheduler; and SGLang's retraction loop releases a request and looks again at once. Without
    this it saw no room come back and retracted 27 of 37 running requests in one step (the H100 trace sweep
    at 2 req/s, "#new_tokens_gained: 0"). Waits for the device: only when the check has failed, where a
    retraction costs far more."""
    alloc.drain(block=True)
    alloc.pool.settle()
    alloc.refresh_headroom()
    if alloc.headroom_pages() >= need_pages:
        return
    if cache is not None:
        reclaim(alloc, cache, need_pages, looked=True)
    else:
        _compact(alloc, need_pages)


def _compact(alloc: Reclaimer, need_pages: int) -> tuple[int, bool]:
    """Compact all layers until ``need_pages`` fit or a pass moves nothing (a pass moves a bounded number
    of pages, ledger.COMPACTION_MAX_PAGES), waiting for the device after each pass. Returns the pages
    moved, and whether the last look at the headroom is still current (it stopped because they fit)."""
    layers = alloc.pool.num_layers
    total = 0
    for _ in range(RECLAIM_COMPACTION_PASSES):
        alloc.refresh_headroom()
        if alloc.headroom_pages() >= need_pages:
            return total, True
        moved = alloc.pool.compact(max_layers=layers, live_fraction=RECLAIM_LIVE_FRACTION)
        alloc.pool.settle()
        moved = alloc.max_over_ranks(moved)  # each rank compacts its own layers; they stop together
        total += moved
        if moved == 0:
            break
    return total, False
