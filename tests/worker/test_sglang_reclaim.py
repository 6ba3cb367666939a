"""Room from a compressed prefix cache: admission never over-promises and allocation reclaims (CPU).

Runs over a real PagePool and ZipkvAllocator. SGLang's RadixCache cannot be imported here (no sglang
package in the test environment), so `LruPrefixCache` (bench/allocator/reclaim_stress.py) stands in for it:
cached requests' slots in LRU order, evicted whole through the allocator's ``free_segment`` as
``RadixCache.evict`` does.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch
from test_sglang_pool import FMT, FMT_V3, fill, make

from bench.allocator.reclaim_stress import LruPrefixCache
from zipkv.allocator import ledger as ledger_module
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.idle_check import idle_check
from zipkv.worker.engines.sglang.reclaim import overcount_tokens


def prefill(alloc: ZipkvAllocator, tokens: int, seed: int) -> torch.Tensor | None:
    """One request's prefill: its pages allocated, written, then compressed over the next steps."""
    one = torch.tensor([tokens])
    out = alloc.alloc_extend(torch.tensor([0]), torch.tensor([0]), one, one, torch.tensor([-1]), tokens)
    if out is None:
        return None
    alloc.compress_step()
    fill(alloc, out, seed)
    for _ in range(6):
        alloc.compress_step()
    return out


def cached_pool(tokens: int, fmt: PageFormat = FMT) -> tuple[ZipkvAllocator, LruPrefixCache]:
    """A pool whose memory is held by finished requests kept in the prefix cache (compressed pages):
    requests of ``tokens`` arrive until the next one no longer fits."""
    alloc = make(fmt=fmt)
    cache = LruPrefixCache(alloc)
    for i in range(1000):
        out = prefill(alloc, tokens, seed=i)
        if out is None:
            break
        cache.entries.append(out)
    assert len(cache.entries) >= 3, "the pool should hold a few requests"
    return alloc, cache


def sglang_alloc(alloc: ZipkvAllocator, cache: LruPrefixCache, tokens: int) -> torch.Tensor | None:
    """What SGLang does for a prefill: evict only the shortfall (evict_from_tree_cache), then allocate."""
    short = tokens + PAGE_TOKENS - alloc.available_size()  # SGLang over-asks by a page per request
    if short > 0:
        cache.evict_tokens(short)
    one = torch.tensor([tokens])
    return alloc.alloc_extend(torch.tensor([0]), torch.tensor([0]), one, one, torch.tensor([-1]), tokens)


def test_overcount_is_a_quarter_of_the_evictable_pages_rounded_up(fmt: PageFormat) -> None:
    assert [overcount_tokens(t, fmt) for t in (0, 1, 16, 64, 65, 640)] == [0, 16, 16, 16, 32, 160]


def test_available_size_holds_back_the_overcount_only_with_a_compressed_cache(fmt: PageFormat) -> None:
    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS, fmt=fmt)
    raw = alloc.available_size()
    alloc.prefix_cache = cache.hooks()
    alloc.decode_reserve_pages = 0  # the held-back figure alone
    assert alloc.available_size() == max(0, raw - overcount_tokens(cache.evictable_tokens(), fmt))
    twin = make(compression=False, fmt=fmt)
    twin.prefix_cache = LruPrefixCache(twin).hooks()
    assert twin.available_size() == make(compression=False, fmt=fmt).available_size()  # raw: no overcount


def sglang_decode_check(alloc: ZipkvAllocator, cache: LruPrefixCache, running: int) -> bool:
    """SGLang's check_decode_mem for `running` requests each at a page boundary: evict the shortfall, then
    the next decode step fits if available_size() covers a page per request."""
    need = running * PAGE_TOKENS
    if alloc.available_size() < need:
        cache.evict_tokens(need - alloc.available_size())
    return alloc.available_size() >= need


def test_a_decode_step_within_the_free_pages_passes_sglangs_check_without_evicting(fmt: PageFormat) -> None:
    # A pool held mostly by the compressed cache: free pages cover the next decode step, but the over-count
    # of the cache is larger than them. SGLang's check must pass on the free pages alone; before, it read 0
    # available, evicted, still read too little (freed bytes return only with an empty chunk) and retracted.
    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS, fmt=fmt)
    alloc.prefix_cache = cache.hooks()
    running = 2
    free_tokens = alloc.headroom_pages() * PAGE_TOKENS
    assert free_tokens >= running * PAGE_TOKENS, "the free pages must cover the step"
    assert overcount_tokens(cache.evictable_tokens(), fmt) > free_tokens, "the over-count must exceed them"
    kept = cache.evictable_tokens()
    assert sglang_decode_check(alloc, cache, running)
    assert cache.evictable_tokens() == kept, "no cached prefix should be evicted for room the pool has"
    seq_lens = torch.full((running,), PAGE_TOKENS + 1)  # each request's next token opens a new page
    assert alloc.alloc_decode(seq_lens, seq_lens, torch.zeros(running, dtype=torch.int64)) is not None


def test_admission_promise_is_kept_when_the_cache_holds_the_memory(fmt: PageFormat) -> None:
    # Without reclaim, SGLang's promise (available + evictable) outruns what the shortfall eviction frees.
    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS, fmt=fmt)
    promise = (alloc.available_size() + cache.evictable_tokens()) // PAGE_TOKENS * PAGE_TOKENS - PAGE_TOKENS
    assert sglang_alloc(alloc, cache, promise) is None, "the case must need more than the shortfall frees"

    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS)
    alloc.prefix_cache = cache.hooks()
    promise = (alloc.available_size() + cache.evictable_tokens()) // PAGE_TOKENS * PAGE_TOKENS - PAGE_TOKENS
    out = sglang_alloc(alloc, cache, promise)
    assert out is not None and out.numel() == promise
    assert cache.evicted_tokens > 0 and len(set((out // PAGE_TOKENS).tolist())) == promise // PAGE_TOKENS
    alloc.free(out)
    leak, msg = idle_check(alloc, cache.evictable_tokens(), 0, 0, 0)
    assert not leak, msg


def test_an_allocation_beyond_what_fits_reclaims_from_the_cache_by_itself() -> None:
    for wired in (False, True):
        alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS)
        alloc.prefix_cache = cache.hooks() if wired else None
        tokens = (alloc.headroom_pages() + 4) * PAGE_TOKENS  # no eviction by the caller first
        one, zero = torch.tensor([tokens]), torch.tensor([0])
        out = alloc.alloc_extend(zero, zero, one, one, torch.tensor([-1]), tokens)
        assert (out is not None) == wired and (cache.evicted_tokens > 0) == wired


def test_reclaim_gives_up_when_the_cache_is_empty() -> None:
    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS)
    alloc.prefix_cache = cache.hooks()
    too_many = alloc.max_pages * PAGE_TOKENS
    assert sglang_alloc(alloc, cache, too_many) is None
    assert cache.evictable_tokens() == 0  # it evicted what there was, then stopped
    leak, msg = idle_check(alloc, 0, 0, 0, 0)
    assert not leak, msg


def test_a_failed_reclaim_says_what_it_did_in_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    alloc, cache = cached_pool(tokens=8 * PAGE_TOKENS)
    alloc.prefix_cache = cache.hooks()
    cached_tokens = cache.evictable_tokens()
    too_many = torch.tensor([alloc.max_pages * PAGE_TOKENS])
    with caplog.at_level(logging.WARNING, logger="zipkv.worker.sglang"):
        zero = torch.tensor([0])
        out = alloc.alloc_extend(zero, zero, too_many, too_many, torch.tensor([-1]), int(too_many))
        assert out is None
    lines = [r.getMessage() for r in caplog.records if "reclaim failed" in r.getMessage()]
    assert len(lines) == 1, lines
    fields = dict(kv.split("=") for kv in lines[0].split()[3:])
    assert int(fields["need_pages"]) == alloc.max_pages
    assert int(fields["evicted_tokens"]) == cached_tokens > 0  # reclaim evicted the whole cache
    assert int(fields["evictable_tokens"]) == 0
    assert int(fields["headroom_pages"]) < alloc.max_pages


def steady_stream(
    tokens: int, wired: bool, requests: int = 40, fmt: PageFormat = FMT
) -> tuple[int, LruPrefixCache]:
    """A server with the radix cache on: every finished request stays cached; new ones keep arriving, each
    after SGLang's shortfall eviction. Returns the allocations that failed, and the cache."""
    alloc = make(fmt=fmt)
    cache = LruPrefixCache(alloc)
    alloc.prefix_cache = cache.hooks() if wired else None
    failed = 0
    for i in range(requests):
        short = tokens + PAGE_TOKENS - alloc.available_size()
        if short > 0:
            cache.evict_tokens(short)
        out = prefill(alloc, tokens, seed=i)
        if out is None:
            failed += 1
            continue
        cache.entries.append(out)
    return failed, cache


@pytest.mark.parametrize(
    ("tokens", "fmt"),
    [(3 * PAGE_TOKENS, FMT), (8 * PAGE_TOKENS, FMT), (13 * PAGE_TOKENS, FMT), (8 * PAGE_TOKENS, FMT_V3)],
    ids=["48-v2", "128-v2", "208-v2", "128-v3"],
)
def test_a_steady_stream_of_cached_requests_never_fails_to_allocate(tokens: int, fmt: PageFormat) -> None:
    failed, cache = steady_stream(tokens, wired=True, fmt=fmt)
    assert failed == 0 and cache.evicted_tokens > 0
    unwired, _ = steady_stream(tokens, wired=False, fmt=fmt)  # SGLang's shortfall eviction alone
    assert unwired > 0, "the stream must need more than the shortfall eviction frees"


@pytest.mark.parametrize(
    ("seed", "fmt"), [(0, FMT), (1, FMT), (2, FMT), (3, FMT_V3)], ids=["0-v2", "1-v2", "2-v2", "3-v3"]
)
def test_random_arrivals_within_the_admission_promise_always_allocate(seed: int, fmt: PageFormat) -> None:
    """Requests of random sizes, some finishing into the cache and some dropped: whenever SGLang's
    admission would take one (size + a page <= available + evictable), its allocation succeeds."""
    rng = random.Random(seed)
    alloc = make(fmt=fmt)
    cache = LruPrefixCache(alloc)
    alloc.prefix_cache = cache.hooks()
    admitted = 0
    for i in range(60):
        tokens = rng.randint(1, 20) * PAGE_TOKENS
        if tokens + PAGE_TOKENS > alloc.available_size() + cache.evictable_tokens():
            continue  # SGLang would not admit it now
        out = sglang_alloc(alloc, cache, tokens)
        assert out is not None, f"request {i} ({tokens} tokens) was admitted but could not allocate"
        admitted += 1
        alloc.compress_step()
        fill(alloc, out, seed=i)
        for _ in range(3):
            alloc.compress_step()
        if rng.random() < 0.7:
            cache.entries.append(out)  # finished into the prefix cache
        else:
            alloc.free(out)  # finished, not cached
    assert admitted > 30 and cache.evicted_tokens > 0
    leak, msg = idle_check(alloc, cache.evictable_tokens(), 0, 0, 0)
    assert not leak, msg


def interleaved_pool(fmt: PageFormat = FMT) -> tuple[ZipkvAllocator, LruPrefixCache, list[torch.Tensor]]:
    """Two requests prefilled a page at a time, turn about, so their compressed pages share chunks: one
    finishes into the prefix cache, the other stays running. Until the next page no longer fits."""
    alloc = make(raw_tokens=96 * PAGE_TOKENS, fmt=fmt)
    cache = LruPrefixCache(alloc)
    live: list[torch.Tensor] = []
    for i in range(1000):
        out = prefill(alloc, PAGE_TOKENS, seed=i)
        if out is None:
            break
        if i % 2 == 0:
            cache.entries.append(out)
        else:
            live.append(out)
    assert len(cache.entries) >= 8 and len(live) >= 8
    return alloc, cache, live


@pytest.mark.parametrize("pass_pages", [4, None], ids=["pass-bound-binds", "default-pass-bound"])
def test_reclaim_makes_room_when_evicted_pages_share_chunks_with_running_ones(
    pass_pages: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Evicting frees no chunk by itself here: every chunk keeps running pages, so the room has to come from
    # compaction, on a pool whose free chunks are fewer than the best move needs, and (first case) with a
    # pass bound below a layer's best move (as 2,048 pages is on a full 8B pool). Before, such a layer
    # moved nothing and SGLang's scheduler died with "Prefill out of memory" (the H100 trace sweep).
    if pass_pages is not None:
        monkeypatch.setattr(ledger_module, "COMPACTION_MAX_PAGES", pass_pages)
    alloc, cache, live = interleaved_pool()
    alloc.prefix_cache = cache.hooks()
    cached_pages = cache.evictable_tokens() // PAGE_TOKENS
    want = (alloc.headroom_pages() + cached_pages // 3) * PAGE_TOKENS  # well within evicting it all
    out = sglang_alloc(alloc, cache, want)
    assert out is not None and out.numel() == want
    assert alloc.pool.compacted_pages > 0, "the room must have come through compaction"
    assert cache.evictable_tokens() > 0, "it should not have had to evict the whole cache"
    alloc.free(out)
    for slots in live:
        alloc.free(slots)
    leak, msg = idle_check(alloc, cache.evictable_tokens(), 0, 0, 0)
    assert not leak, msg
