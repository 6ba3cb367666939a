"""Tensor-parallel ranks answer SGLang alike and lend compression's bytes (rank_agreement.py), on the CPU.

Each rank is a thread with its own ZipkvAllocator over a real PagePool; `Lockstep` is their all-reduce MIN
(every call blocks until each rank has made it, as a collective does: a rank that skipped one would hang
the test at the barrier's timeout). The last test runs the gloo reduce the seams wire in, across two real
processes.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_sglang_pool import fill, make
from test_sglang_reclaim import sglang_alloc

from bench.allocator import reclaim_stress as stress
from bench.allocator.reclaim_stress import LruPrefixCache
from zipkv.allocator import ledger as ledger_module
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.worker.engines.sglang.allocator import ZipkvAllocator
from zipkv.worker.engines.sglang.rank_agreement import ReduceMin, gloo_reduce_min

RANKS = 2


class Lockstep:
    """An all-reduce MIN over threads standing in for ranks; counts each rank's calls."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks, timeout=30)
        self.values: dict[int, list[int]] = {}
        self.calls = [0] * ranks

    def for_rank(self, rank: int) -> ReduceMin:
        def reduce_min(values: list[int]) -> list[int]:
            self.values[rank] = list(values)
            self.calls[rank] += 1
            self.barrier.wait()
            out = [min(v[i] for v in self.values.values()) for i in range(len(values))]
            self.barrier.wait()  # every rank has read before the next call overwrites
            return out

        return reduce_min


def tp_allocator(lockstep: Lockstep, rank: int, fmt: PageFormat, pages: int = 128) -> ZipkvAllocator:
    alloc = make(pages * PAGE_TOKENS, fmt=fmt)
    alloc.agree_across_ranks()
    assert alloc.ranks is not None
    alloc.ranks.reduce_min = lockstep.for_rank(rank)
    return alloc


def on_ranks(body: Callable[[int, Lockstep], Any]) -> list[Any]:
    """Run ``body(rank, lockstep)`` on every rank at once; re-raise the first failure."""
    lockstep = Lockstep(RANKS)
    results: list[Any] = [None] * RANKS
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank, lockstep)
        except BaseException as e:  # surfaced below, in the test's thread
            errors.append(e)
            lockstep.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert len(set(lockstep.calls)) == 1, f"ranks ran different numbers of collectives: {lockstep.calls}"
    return results


def extend(alloc: ZipkvAllocator, tokens: int) -> torch.Tensor | None:
    one = torch.tensor([tokens])
    return alloc.alloc_extend(torch.tensor([0]), torch.tensor([0]), one, one, torch.tensor([-1]), tokens)


def own_headroom(alloc: ZipkvAllocator) -> int:
    return min(alloc.pool.headroom_pages(), alloc.free_page_ids())


def prefill(alloc: ZipkvAllocator, rank: int, tokens: int, seed: int) -> torch.Tensor | None:
    """Rank 0's pages hold random KV; rank 1's stay as the heap holds them (zeros: they compress further)."""
    out = extend(alloc, tokens)
    if out is None:
        return None
    alloc.compress_step()
    if rank == 0:
        fill(alloc, out, seed)
    for _ in range(6):
        alloc.compress_step()
    return out


def agreed_prefill(alloc: ZipkvAllocator, rank: int, tokens: int, seed: int) -> torch.Tensor:
    """A scheduler pass's agreement, one request's prefill (prefill above), the next pass's agreement."""
    alloc.refresh_headroom()
    out = prefill(alloc, rank, tokens, seed)
    assert out is not None
    alloc.refresh_headroom()
    return out


def test_ranks_answer_alike_and_lend_what_the_least_compressing_rank_saved(fmt: PageFormat) -> None:
    n = 192 * PAGE_TOKENS  # of 256 pages: enough that chunk-level slack leaves the savings visible

    def body(rank: int, lockstep: Lockstep) -> tuple[int, int, int]:
        alloc = tp_allocator(lockstep, rank, fmt, pages=256)
        alloc.refresh_headroom()
        before = alloc.available_size()
        assert prefill(alloc, rank, n, seed=1) is not None
        alloc.refresh_headroom()
        return before, alloc.available_size(), own_headroom(alloc)

    (b0, a0, own0), (b1, a1, own1) = on_ranks(body)
    assert b0 == b1 and a0 == a1  # one answer for SGLang on every rank
    assert own0 != own1  # alone, the ranks would have admitted differently
    assert a0 == min(own0, own1) * PAGE_TOKENS  # the least-compressing rank's room
    assert a0 > b0 - n  # more than the raw view: compression's bytes are lent


def test_an_allocation_is_given_on_every_rank_or_on_none(fmt: PageFormat) -> None:
    def body(rank: int, lockstep: Lockstep) -> tuple[bool, bool, int, int]:
        alloc = tp_allocator(lockstep, rank, fmt)
        agreed_prefill(alloc, rank, 32 * PAGE_TOKENS, seed=2)
        agreed = alloc.headroom_pages()
        live, used = alloc.held_tokens(), alloc.pool.stats().used_pages
        private: list[int] = []
        if rank == 1:  # its own room dips below the agreed count (as while an encode's chunks are in flight)
            private = alloc.pool.allocate(own_headroom(alloc) - agreed // 2)
        refused = extend(alloc, agreed * PAGE_TOKENS) is None
        unchanged = alloc.held_tokens() == live and alloc.pool.stats().used_pages == used + len(private)
        alloc.pool.free(private)
        alloc.refresh_headroom()
        given = extend(alloc, agreed * PAGE_TOKENS) is not None
        return refused, given, agreed, int(unchanged)

    (r0, g0, agreed0, u0), (r1, g1, agreed1, u1) = on_ranks(body)
    assert agreed0 == agreed1
    assert r0 and r1  # rank 0 had the room, and still refused: rank 1 had not
    assert u0 and u1  # rank 0 put its pages back
    assert g0 and g1  # once rank 1's room is back, both give it


def test_frees_count_at_the_next_agreement(fmt: PageFormat) -> None:
    def body(rank: int, lockstep: Lockstep) -> tuple[int, int, int]:
        alloc = tp_allocator(lockstep, rank, fmt)
        out = agreed_prefill(alloc, rank, 40 * PAGE_TOKENS, seed=3)
        held = alloc.available_size()
        alloc.free(out)
        before_agreement = alloc.available_size()
        alloc.refresh_headroom()
        return held, before_agreement, alloc.available_size()

    for held, before_agreement, after in on_ranks(body):
        assert before_agreement == held  # the free landed on this rank; the others may not know theirs yet
        assert after > held


def test_the_decode_check_takes_in_late_frees_alike_on_every_rank(fmt: PageFormat) -> None:
    # SGLang's decode check failed on the agreed count; frees issued since then are taken in by an
    # agreement inside decode_room, so every rank answers yes together instead of retracting.
    def body(rank: int, lockstep: Lockstep) -> tuple[bool, bool, int]:
        alloc = tp_allocator(lockstep, rank, fmt)
        first = agreed_prefill(alloc, rank, 64 * PAGE_TOKENS, seed=5)
        rest = extend(alloc, alloc.available_size())  # the agreed room, all of it
        assert rest is not None and alloc.available_size() == 0
        need = 8 * PAGE_TOKENS
        short_before = alloc.available_size() < need
        alloc.free(first)  # a request finished: its pages are free, not yet agreed on
        return short_before, alloc.decode_room(need), alloc.available_size()

    (s0, ok0, after0), (s1, ok1, after1) = on_ranks(body)
    assert s0 and s1  # the check had failed on both
    assert ok0 and ok1 and after0 == after1 >= 64 * PAGE_TOKENS  # the late frees, agreed on both


@pytest.mark.parametrize("tokens", [7 * PAGE_TOKENS])
def test_reclaim_evicts_alike_on_every_rank(fmt: PageFormat, tokens: int) -> None:
    # Each rank holds its own copy of the same prefix cache (SGLang replicates the radix tree): the ranks'
    # pools compress differently, yet they must evict the same entries and answer the same.
    def body(rank: int, lockstep: Lockstep) -> tuple[int, list[bool]]:
        alloc = tp_allocator(lockstep, rank, fmt, pages=64)
        cache = LruPrefixCache(alloc)
        alloc.prefix_cache = cache.hooks()
        for i in range(1000):
            alloc.refresh_headroom()  # a scheduler pass
            out = prefill(alloc, rank, tokens, seed=i)
            if out is None:
                break
            cache.entries.append(out)
        answers = []
        for _ in range(4):
            alloc.refresh_headroom()
            out = sglang_alloc(alloc, cache, 3 * tokens)
            answers.append(out is not None)
            if out is not None:
                alloc.free(out)
        return len(cache.entries), answers

    (left0, answers0), (left1, answers1) = on_ranks(body)
    assert left0 == left1 and answers0 == answers1
    assert any(answers0)  # reclaiming from the cache made room


def _gloo_rank(rank: int, rendezvous: str, out: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=RANKS)
    try:
        out.put((rank, gloo_reduce_min(None)([10 + rank, -rank])))
    finally:
        dist.destroy_process_group()


def test_the_gloo_reduce_takes_the_least_over_real_processes(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_gloo_rank, args=(r, rendezvous, out)) for r in range(RANKS)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == {0: [10, -1], 1: [10, -1]}  # min of 10/11, and of 0/-1 (a max, negated)


def test_each_scheduler_pass_starts_with_an_agreement(
    monkeypatch: pytest.MonkeyPatch, fmt: PageFormat
) -> None:
    # seams' hook around Scheduler.get_next_batch_to_run, on a stand-in for SGLang's Scheduler (SGLang
    # cannot run here; tests/worker/test_sglang_seams.py checks the real method's signature and fields).
    from zipkv.worker.engines.sglang import seams

    monkeypatch.setitem(seams._CLASSES, "allocator", ZipkvAllocator)
    groups: list[object] = []

    def wired(group: object) -> ReduceMin:
        groups.append(group)
        return Lockstep(1).for_rank(0)  # one rank: the least is its own

    monkeypatch.setattr(seams, "gloo_reduce_min", wired)

    class Scheduler:
        def get_next_batch_to_run(self, running_batch: object, last_batch: object) -> str:
            return "plan"

    seams._patch_pass_start(Scheduler)
    tp, alone = Scheduler(), Scheduler()
    tp.token_to_kv_pool_allocator = make(fmt=fmt)  # type: ignore[attr-defined]
    tp.token_to_kv_pool_allocator.agree_across_ranks()  # type: ignore[attr-defined]
    tp.tp_cpu_group = "the scheduler's gloo group"  # type: ignore[attr-defined]
    alone.token_to_kv_pool_allocator = make(fmt=fmt)  # type: ignore[attr-defined]
    for _ in range(3):
        assert tp.get_next_batch_to_run(None, None) == "plan"
        assert alone.get_next_batch_to_run(None, None) == "plan"
    ranks = tp.token_to_kv_pool_allocator.ranks  # type: ignore[attr-defined]
    assert groups == ["the scheduler's gloo group"]  # wired once, on the first pass
    assert ranks.agreements == 3  # one agreement a pass
    assert alone.token_to_kv_pool_allocator.ranks is None  # type: ignore[attr-defined]


def test_a_long_sglang_like_run_keeps_the_ranks_in_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reclaim stress workload (SGLang's admission, chunked prefill, decode checks, a prefix cache
    # evicted under pressure), replayed on two ranks whose KV differs (different random values, so their
    # pages compress to different sizes): every decision must match, step by step. The compaction pass
    # is scaled to the small pool (ledger.COMPACTION_MAX_PAGES is sized for a full 8B pool), as the stress
    # bench's --pass-pages does. 12 chunks a layer: coarser pools can fail an allocation with or without
    # tensor parallelism (docs/benchmarks.md, the reclaim stress at 8 chunks a layer), not what this checks.
    monkeypatch.setattr(ledger_module, "COMPACTION_MAX_PAGES", 33)
    w = stress.Workload(layers=2, raw_tokens=6144, steps=160, kv_heads=1, head_dim=64, prompt_log_mean=6.0)

    def body(rank: int, lockstep: Lockstep) -> list[tuple[int, int, str]]:
        alloc = stress.make_allocator(w)
        alloc.agree_across_ranks()
        assert alloc.ranks is not None
        alloc.ranks.reduce_min = lockstep.for_rank(rank)
        cache = stress.LruPrefixCache(alloc)
        alloc.prefix_cache = cache.hooks()
        rng, gen = random.Random(w.seed), torch.Generator().manual_seed(1000 + rank)  # same requests
        running: list[stress.Running] = []
        trace = []
        for step in range(w.steps):
            alloc.refresh_headroom()  # the scheduler pass's agreement
            trace.append((step, alloc.available_size(), "pass"))
            for _kind, outcome in stress.pass_work(alloc, cache, running, w, rng, gen):
                trace.append((step, alloc.available_size(), outcome))
            stress.pass_end(alloc, cache, running)
        return trace

    trace0, trace1 = on_ranks(body)
    assert trace0 == trace1
    outcomes = {kind for _, _, kind in trace0}
    # it ran under memory pressure (prefills waited for room, the cache was evicted), and no allocation failed
    assert "failed" not in outcomes and {"ok", "skipped"} <= outcomes


def test_a_decode_check_that_reclaims_runs_no_look_twice(fmt: PageFormat) -> None:
    # decode_room agrees on the headroom, finds it short and reclaims: reclaim's first round takes that
    # look instead of agreeing again, and a look that found room ends it (each look is a collective).
    tokens = 7 * PAGE_TOKENS

    def body(rank: int, lockstep: Lockstep) -> tuple[bool, int, int]:
        alloc = tp_allocator(lockstep, rank, fmt, pages=64)
        cache = LruPrefixCache(alloc)
        alloc.prefix_cache = cache.hooks()
        alloc.refresh_headroom()
        while alloc.available_size() >= tokens:  # fill up to the agreed room; no reclaim yet
            out = prefill(alloc, rank, tokens, seed=len(cache.entries))
            assert out is not None
            cache.entries.append(out)
            alloc.refresh_headroom()  # a scheduler pass
        calls = lockstep.calls[rank]
        ok = alloc.decode_room(3 * tokens)
        return ok, lockstep.calls[rank] - calls, len(cache.entries)

    (ok0, calls0, left0), (ok1, calls1, left1) = on_ranks(body)
    assert ok0 and ok1 and left0 == left1
    # one look in decode_room, one per compaction pass until the room is there; before, reclaim looked
    # again on entry, at each round's start and at its end (5 collectives here)
    assert calls0 == calls1 == 2
