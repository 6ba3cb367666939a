"""Headroom the tensor-parallel ranks agree on: their schedulers admit alike, and compression lends its bytes.

Under tensor parallelism SGLang runs one scheduler per rank, each over its own pool (its own KV heads), and
relies on every rank choosing the same batches: a rank that admits one request more than the others sends
the model's collectives different shapes, and the step hangs. zipkv's live headroom differs between ranks:
each compresses its own heads to its own sizes, and learns of freed pages when their device copies land
(readback.py), a step later on one rank than on another.

So every rank answers SGLang from one number. At agreed points (the start of each scheduler pass, and where
an allocation, reclaim or decode check falls short: points every rank reaches alike, because what led
there was decided on the agreed number) the ranks take the least live headroom among them, an all-reduce
MIN over SGLang's CPU group (gloo); between those points each counts down the pages it allocates, the same
pages on every rank (same tokens, same 16-token pages). A rank's own headroom normally stays at or above
that count (a page allocated takes one page of headroom; frees and compression only add; frees are
credited at the next agreed point), but an encode launch taking new LOG chunks can dip it for a moment: so
whether an allocation is given is decided together too, by one more all-reduce.

Before the scheduler wires the reduce (its first pass, before any allocation) the agreed count is what the
empty pool fits at raw size, the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from zipkv.worker.engines.sglang.reclaim import PrefixCache, Reclaimer, reclaim
from zipkv.worker.engines.sglang.telemetry import log_reclaim_failure

ReduceMin = Callable[[list[int]], list[int]]  # element-wise minimum of the list over all ranks


@dataclass
class RankAgreement:
    """The headroom (in pages) every rank answers with, and the pages allocated since it was agreed."""

    agreed_pages: int
    taken_pages: int = 0
    reduce_min: ReduceMin | None = None  # None until the scheduler's first pass wires its CPU group
    agreements: int = 0  # headroom agreements run (tests read it)

    def headroom_pages(self) -> int:
        return max(0, self.agreed_pages - self.taken_pages)

    def take(self, pages: int) -> None:
        self.taken_pages += pages

    def agree(self, local_headroom_pages: int) -> int:
        """A collective: every rank calls it at the same point with its own live headroom; afterwards all
        answer with the least of them. Before the reduce is wired it keeps the raw bound."""
        if self.reduce_min is None:
            return self.headroom_pages()
        (self.agreed_pages,) = self.reduce_min([local_headroom_pages])
        self.taken_pages = 0
        self.agreements += 1
        return self.agreed_pages

    def max_over_ranks(self, value: int) -> int:
        """A collective: the largest ``value`` any rank holds (whether any rank still moved pages)."""
        if self.reduce_min is None:
            return value
        return -self.reduce_min([-value])[0]


class AgreeingAllocator(Reclaimer, Protocol):
    """What an agreed allocation needs of zipkv's SGLang allocator (allocator.ZipkvAllocator)."""

    @property
    def prefix_cache(self) -> PrefixCache | None: ...

    def take_pages(self, n: int) -> list[int] | None: ...

    def put_back_pages(self, page_ids: list[int]) -> None: ...

    def free_page_ids(self) -> int: ...


def agreed_new_pages(alloc: AgreeingAllocator, ranks: RankAgreement, n: int) -> list[int] | None:
    """``n`` new page ids, or None, answered alike on every rank: each branch tests the agreed count or
    follows a collective, so every rank takes the same ones."""
    if n == 0:
        return []
    if n > ranks.headroom_pages():
        alloc.drain(block=True)  # frees still in flight count at this agreement
        alloc.refresh_headroom()
        if n > ranks.headroom_pages() and alloc.prefix_cache is not None:
            outcome = reclaim(alloc, alloc.prefix_cache, n, looked=True)  # its looks are agreements too
            if not outcome.fit:
                log_reclaim_failure(n, outcome, alloc.pool, alloc.free_page_ids())
        if n > ranks.headroom_pages():
            return None
    ids = alloc.take_pages(n)
    # A rank's own room can dip below the agreed count while an encode's new chunks are in flight: the
    # pages are given only if every rank got them, and put back where they were not needed.
    if ranks.max_over_ranks(int(ids is None)):
        if ids:
            alloc.put_back_pages(ids)
        return None
    ranks.take(n)
    return ids


def gloo_reduce_min(group: Any) -> ReduceMin:
    """An all-reduce MIN of small integer lists over a torch.distributed CPU (gloo) process group."""
    import torch
    import torch.distributed as dist

    def reduce_min(values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return [int(v) for v in t.tolist()]

    return reduce_min
