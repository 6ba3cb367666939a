"""Invariants of the PagePool under random workloads (hypothesis stateful), with real pages and the torch
reference encoder: no two live pages overlap, bytes are conserved, every page id resolves to a place that
holds its data, and admitting what capacity reports then running every admitted request to its maximum
length never runs out of memory. Capacity is also exact: what it reports can be allocated, not more.

Pools are built at page formats v2 and v3. ZIPKV_ALLOC_EXAMPLES=400 runs a longer search."""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pool_harness import FORMATS, KINDS, Harness, make_pool

from zipkv.allocator.audit import check
from zipkv.allocator.plans import OutOfPages
from zipkv.kernels.format.layout import PageFormat


class PoolMachine(RuleBasedStateMachine):
    harness: Harness

    @initialize(
        layers=st.integers(1, 3),
        chunks=st.integers(10, 32),
        shared=st.booleans(),
        compression=st.sampled_from([True, True, True, False]),
        interval=st.integers(1, 4),
        fmt=st.sampled_from(FORMATS),
        first=st.lists(st.tuples(st.integers(32, 160), st.sampled_from(KINDS)), min_size=2, max_size=5),
    )
    def start(
        self,
        layers: int,
        chunks: int,
        shared: bool,
        compression: bool,
        interval: int,
        fmt: PageFormat,
        first: list[tuple[int, str]],
    ) -> None:
        event(f"page format v{fmt.version}")
        pool = make_pool(layers, chunks, shared, compression, fmt, compaction_interval_steps=interval)
        self.harness = Harness(pool)
        for max_tokens, kind in first:
            self.harness.admit(max_tokens, kind)

    @rule(max_tokens=st.integers(1, 160), kind=st.sampled_from(KINDS))
    def admit(self, max_tokens: int, kind: str) -> None:
        fit = self.harness.pool.headroom_pages()
        if self.harness.admit(max_tokens, kind) is None:
            with pytest.raises(OutOfPages):  # capacity said no, and reserving agrees
                self.harness.pool.reserve("too-big", -(-max_tokens // 16))
            assert fit < -(-max_tokens // 16)

    @precondition(lambda self: bool(self.harness.running))
    @rule(tokens=st.integers(4, 24))
    def step(self, tokens: int) -> None:
        self.harness.step(tokens)
        stats = self.harness.pool.stats()
        event(f"compressed pages: {'some' if stats.compressed_pages else 'none'}")
        event(f"compacted so far: {self.harness.pool.compacted_pages > 0}")

    @precondition(lambda self: bool(self.harness.running))
    @rule(pick=st.integers(0, 1000))
    def finish_early(self, pick: int) -> None:
        rids = sorted(self.harness.running)
        self.harness.finish(rids[pick % len(rids)])

    @rule()
    def compact(self) -> None:
        self.harness.pool.compact()
        self.harness.pool.poll()

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        check(self.harness.pool.ledger)

    @invariant()
    def every_page_reads_back(self) -> None:
        self.harness.check_data()

    @invariant()
    def capacity_is_exact_and_reservations_hold(self) -> None:
        led = copy.deepcopy(self.harness.pool.ledger)
        led.allocate(led.headroom_pages())  # what capacity reports really fits ...
        for rid, pages in list(led.reservations.items()):
            led.allocate(pages, rid)  # ... and every running request can still reach its maximum
        with pytest.raises(OutOfPages):
            led.allocate(1)
        check(led)


PoolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ZIPKV_ALLOC_EXAMPLES", "30")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPoolInvariants = PoolMachine.TestCase
