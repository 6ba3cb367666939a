"""The host bookkeeping under random workloads where the device lags: encode launches and chunk drains
finish only when the test says so (as on a GPU running a step behind), pages are freed while their encode
is in flight, sizes arrive after later launches were placed behind them. Invariants as in the pool test:
no overlap, conservation, exact capacity, reservations always allocatable. Stored sizes are drawn from the
valid range (1 unit to a raw page); real encoder output is covered by test_pool_stateful.py."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from alloc_helpers import FenceLog, ManualFence, ledger
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from zipkv.allocator.audit import check
from zipkv.allocator.ledger import Ledger
from zipkv.allocator.plans import OutOfPages, PageState

RAW = 4


class LedgerMachine(RuleBasedStateMachine):
    led: Ledger
    fences: FenceLog

    @initialize(
        layers=st.integers(1, 3),
        chunks=st.integers(6, 24),
        per_chunk=st.integers(2, 8),
        shared=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def start(self, layers: int, chunks: int, per_chunk: int, shared: bool, seed: int) -> None:
        self.fences = FenceLog()
        chunks = max(chunks, layers)
        self.led = ledger(
            layers, chunks, RAW * per_chunk, RAW, 4 * chunks * per_chunk, shared, True, self.fences
        )
        self.launches: list[ManualFence] = []
        self.pages: dict[str, list[int]] = {}
        self.rng = np.random.default_rng(seed)
        self.count = 0

    @rule(max_pages=st.integers(1, 12))
    def admit(self, max_pages: int) -> None:
        if self.led.headroom_pages() >= max_pages:
            rid = f"r{self.count}"
            self.count += 1
            self.led.reserve(rid, max_pages)
            self.pages[rid] = []

    @rule(grow=st.integers(0, 3), fraction=st.floats(0, 1), compact=st.booleans())
    def step(self, grow: int, fraction: float, compact: bool) -> None:
        """Requests take pages (from their reservations), some pages fill, then one end_step."""
        for rid in sorted(self.pages):
            n = min(grow, self.led.reservations.get(rid, 0))
            if n:
                ids, _ = self.led.allocate(n, rid)  # a reserved page must always be there
                self.pages[rid] += ids.tolist()
        raw = np.flatnonzero(self.led.page_state == PageState.RAW)
        self.led.mark_full(raw[self.rng.random(raw.size) < fraction])
        self.led.poll()
        plan = self.led.plan_encode()
        if plan is not None:
            event("encode launched")
            sizes = self.rng.integers(1, RAW + 1, plan.size) * 256
            fence = ManualFence()
            self.launches.append(fence)
            self.led.launched(plan, fence, lambda: sizes)
        if compact and (move := self.led.plan_compaction()) is not None:
            event("compaction moved pages")
            self.led.moved(move)
        self.led.poll()

    @rule(k=st.integers(1, 3))
    def device_catches_up(self, k: int) -> None:
        for fence in self.launches[:k]:
            fence.finished = True
        del self.launches[:k]
        for fence in self.fences.fences[: 2 * k]:
            fence.finished = True
        del self.fences.fences[: 2 * k]
        self.led.poll()

    @rule()
    def settle_and_compact(self) -> None:
        """The device catches up completely, then one compaction round."""
        self.device_catches_up(len(self.launches) + len(self.fences.fences))
        if (move := self.led.plan_compaction()) is not None:
            event("compaction moved pages")
            self.led.moved(move)
        self.led.poll()

    @precondition(lambda self: bool(self.pages))
    @rule(pick=st.integers(0, 1000))
    def finish(self, pick: int) -> None:
        rid = sorted(self.pages)[pick % len(self.pages)]
        if (self.led.page_state[self.pages[rid]] == PageState.ENCODING).any():
            event("freed while encoding")
        self.led.free(self.pages.pop(rid))
        self.led.release(rid)

    @invariant()
    def consistent(self) -> None:
        check(self.led)
        log = self.led.chunk_kind == 2
        if (self.led.chunk_bump[log] > self.led.chunk_live[log]).any():
            event("dead bytes in a LOG chunk")

    @invariant()
    def capacity_is_exact_and_reservations_hold(self) -> None:
        led = copy.deepcopy(self.led)
        led.allocate(led.headroom_pages())
        for rid, n in list(led.reservations.items()):
            led.allocate(n, rid)
        with pytest.raises(OutOfPages):
            led.allocate(1)


LedgerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ZIPKV_ALLOC_EXAMPLES", "200")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLedgerInvariants = LedgerMachine.TestCase
