"""The allocator's four rules (docs/design.md) on the host bookkeeping, one behaviour per test.

Sizes handed to the ledger here are stored sizes in 256-byte units, chosen to exercise the bookkeeping
(any size from 1 unit to a raw page is valid input); tests with real compressed pages are in
test_pool.py and test_pool_stateful.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from alloc_helpers import FenceLog, ManualFence, encode_with, ledger

from zipkv.allocator.audit import check
from zipkv.allocator.ledger import Ledger
from zipkv.allocator.plans import ChunkKind, CompletedFence, OutOfPages, PageState

RAW = 16  # units of a raw page in these tests; 4 raw pages per 64-unit chunk


def test_new_pages_take_raw_size_in_every_layer() -> None:
    led = ledger(layers=3, chunks=12)
    ids, units = led.allocate(5)
    assert units.shape == (3, 5)
    assert (led.page_units[:, ids] == RAW).all()
    assert (units % RAW == 0).all() and len({int(u) for u in units.ravel()}) == 15
    check(led)


def test_capacity_is_exact_for_raw_pages() -> None:
    led = ledger(layers=2, chunks=8, compression=False)  # 8 chunks x 4 slots shared by 2 layers: 16 pages
    assert led.headroom_pages() == 16
    led.allocate(3)
    assert led.headroom_pages() == 13
    led.allocate(13)
    assert led.headroom_pages() == 0
    with pytest.raises(OutOfPages, match="do not fit"):
        led.allocate(1)
    check(led)


def test_pool_lends_a_layers_savings_to_the_tightest_layer() -> None:
    """The seed's point, on real bookkeeping: layer 0 compresses to 25%, layer 1 not at all."""
    fits = {}
    for shared in (False, True):
        led = ledger(layers=2, chunks=20, max_pages=200, shared_pool=shared)
        ids, _ = led.allocate(16)
        led.mark_full(ids)
        while led.full_queue:
            encode_with(led, lambda p: np.where(p.layers == 0, RAW // 4, RAW))
            led.poll()
        # worst-case places spread layer 0's pages over 4 chunks; compaction packs them into one
        while (move := led.plan_compaction()) is not None:
            led.moved(move)
            led.poll()
        check(led)
        fits[shared] = led.headroom_pages()
        # what capacity reports can really be allocated, and not one page more
        led.allocate(fits[shared])
        with pytest.raises(OutOfPages):
            led.allocate(1)
    # layer 1's 16 incompressible pages fill 4 chunks; layer 0's 16 pages of 4 units fill one. The encode
    # margin (a chunk per layer, 4 pages) is held only out of room compression freed beyond what
    # compression off would have (10 chunks x 4 slots - 16 pages = 24 per layer).
    assert fits[False] == 24  # layer 1 owns 10 chunks: 6 free x 4 pages, no more than off; no margin held
    assert fits[True] == 28 - 4  # 15 free chunks in the pool: 7 for each layer, less the margin


def test_compressed_sizing_would_over_admit_and_is_refused() -> None:
    led = ledger(layers=2, chunks=20, max_pages=400, shared_pool=False)
    ids, _ = led.allocate(16)
    led.mark_full(ids)
    while led.full_queue:
        encode_with(led, lambda p: np.full(p.size, RAW // 4))
        led.poll()
    free_units = led.free_units()
    naive = int(free_units.min() // (RAW // 4))  # pages priced at their compressed size
    assert naive > led.headroom_pages()
    with pytest.raises(OutOfPages):
        led.allocate(naive)
    # the pages' raw slots are free again, but their LOG places still fill the chunks they took: no room
    # beyond compression off's (10 chunks x 4 slots - 16 pages), so no encode margin is held
    assert led.headroom_pages() == int(free_units.min() // RAW) == 10 * 4 - 16
    assert led.held_margin_pages() == 0
    check(led)


def test_sizes_arrive_a_step_later_and_capacity_is_never_optimistic() -> None:
    fences = FenceLog()
    led = ledger(layers=2, chunks=16, fences=fences)
    ids, _ = led.allocate(8)
    led.mark_full(ids)
    before = led.headroom_pages()
    launch = ManualFence()
    plan = encode_with(led, lambda p: np.full(p.size, 12), launch)
    assert plan is not None and plan.size == 16
    led.poll()  # the launch has not finished: worst case held, raw slots still held
    assert (led.page_state[ids] == PageState.ENCODING).all()
    pending = led.headroom_pages()
    assert pending <= before
    check(led)
    launch.finished = True
    led.poll()  # sizes are back: raw slots free, tails refunded; emptied raw chunks drain
    assert (led.page_state[ids] == PageState.COMPRESSED).all()
    assert (led.page_units[:, ids] == 12).all()
    assert (led.chunk_kind == ChunkKind.DRAINING).sum() == 4
    assert led.headroom_pages() == pending  # draining chunks are not counted yet
    fences.finish_all()
    led.poll()
    assert led.headroom_pages() > pending
    check(led)


def test_a_chunk_returns_to_the_pool_only_when_its_reads_are_done() -> None:
    fences = FenceLog()
    led = ledger(layers=2, chunks=8, fences=fences)
    ids, units = led.allocate(4)
    chunk = int(units[0, 0] // 64)
    pool_before = len(led.pool)
    led.free(ids)
    assert led.chunk_kind[chunk] == ChunkKind.DRAINING and len(led.pool) == pool_before
    led.poll()
    assert len(led.pool) == pool_before  # its fence is not done: a read may still be in flight
    fences.finish_all()
    led.poll()
    assert len(led.pool) == pool_before + 2 and led.chunk_kind[chunk] == ChunkKind.FREE
    check(led)


def test_refund_rolls_the_bump_pointer_back_and_tails_are_reused() -> None:
    led = ledger(layers=1, chunks=8, max_pages=64)
    ids, _ = led.allocate(4)
    led.mark_full(ids)
    encode_with(led, lambda p: np.full(p.size, 12))
    led.poll()
    chunk = int(led.page_chunk[0, ids[0]])
    assert led.chunk_bump[chunk] == 48 and led.log_rooms[0] == [chunk]
    more, _ = led.allocate(1)
    led.mark_full(more)
    encode_with(led, lambda p: np.full(p.size, 12))
    led.poll()
    assert led.page_chunk[0, more[0]] == chunk and led.page_unit[0, more[0]] == chunk * 64 + 48
    check(led)


def _two_in_three_dead() -> tuple[Ledger, np.ndarray]:
    """Two layers of compressed pages of 12 units (5 to a 64-unit chunk), two in three then freed; returns
    the ledger and the pages still live."""
    led = ledger(layers=2, chunks=24, max_pages=128)
    ids, _ = led.allocate(32)
    led.mark_full(ids)
    while led.full_queue:
        encode_with(led, lambda p: np.full(p.size, 12))
        led.poll()
    led.free(ids[::3].tolist() + ids[1::3].tolist())  # two pages in three die
    return led, ids[2::3]


def test_compaction_moves_live_pages_and_frees_chunks() -> None:
    led, keep = _two_in_three_dead()
    check(led)
    log_chunks = int((led.chunk_kind == ChunkKind.LOG).sum())
    fit_before = led.headroom_pages()
    before = led.page_unit[:, keep].copy()
    plan = led.plan_compaction()
    assert plan is not None and plan.pages.size > 0
    led.moved(plan)
    led.poll()
    check(led)
    assert int((led.chunk_kind == ChunkKind.LOG).sum()) < log_chunks
    assert led.headroom_pages() > fit_before
    moved = led.page_unit[plan.layers, plan.pages]
    assert (moved == plan.dst_units).all() and (before != led.page_unit[:, keep]).any()


def test_compaction_within_a_page_budget_moves_part_of_a_larger_move() -> None:
    """A pass's page budget smaller than a layer's best move: the pass moves the part that fits and frees
    chunks with it, and passes repeated within the budget free as many chunks as one unbounded pass.
    (The budget once dropped such a layer whole: nothing moved, and a reclaim under pressure found no room
    however much of the prefix cache it evicted.)"""
    whole, _ = _two_in_three_dead()
    plan = whole.plan_compaction()
    assert plan is not None and plan.pages.size > 3, "the case needs a move larger than the budget"
    whole.moved(plan)
    whole.poll()
    led, _ = _two_in_three_dead()
    log_chunks = int((led.chunk_kind == ChunkKind.LOG).sum())
    passes = 0
    while (move := led.plan_compaction(max_pages=3, max_layers=2)) is not None:
        assert move.pages.size <= 3
        led.moved(move)
        led.poll()
        check(led)
        passes += 1
    after = int((led.chunk_kind == ChunkKind.LOG).sum())
    assert passes > 1 and after < log_chunks
    assert after <= int((whole.chunk_kind == ChunkKind.LOG).sum())
    assert led.headroom_pages() >= whole.headroom_pages()


def test_reservations_are_honoured() -> None:
    led = ledger(layers=2, chunks=8, compression=False)  # 16 pages
    led.reserve("a", 10)
    assert led.headroom_pages() == 6
    with pytest.raises(OutOfPages, match="cannot reserve 7"):
        led.reserve("b", 7)
    with pytest.raises(OutOfPages):
        led.allocate(7)  # unreserved pages may not eat into "a"'s room
    led.allocate(6)
    led.allocate(10, "a")  # "a" can always reach its maximum
    assert led.reservations["a"] == 0 and led.headroom_pages() == 0
    led.release("a")
    check(led)


def test_bad_calls_change_nothing() -> None:
    led = ledger()
    ids, _ = led.allocate(2)
    snapshot = (led.page_state.copy(), led.chunk_live.copy(), [list(s) for s in led.slots])
    with pytest.raises(ValueError, match="FREE"):
        led.free([int(ids[0]), 40])
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        led.mark_full([64])
    with pytest.raises(ValueError, match="one per page"):
        led.allocate(2, ["a"])
    assert (led.page_state == snapshot[0]).all() and (led.chunk_live == snapshot[1]).all()
    assert [list(s) for s in led.slots] == snapshot[2]
    with pytest.raises(OutOfPages, match="max_pages"):
        ledger(max_pages=3).allocate(4)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="whole raw pages"):
        ledger(chunk_units=40)
    with pytest.raises(ValueError, match="each of 4 layers"):
        ledger(layers=4, chunks=3)


def test_without_compression_pages_stay_raw() -> None:
    led = ledger(compression=False)
    ids, _ = led.allocate(3)
    led.mark_full(ids)
    assert led.plan_encode() is None and (led.page_units[:, ids] == RAW).all()


def test_idle_capacity_equals_compression_off() -> None:
    """The encode margin is held only out of room compression freed: an idle pool offers as many new
    pages with compression on as off, and a request reserving all of them reaches its maximum."""
    on, off = ledger(layers=2, chunks=8), ledger(layers=2, chunks=8, compression=False)
    assert on.headroom_pages() == off.headroom_pages() == 16 and on.held_margin_pages() == 0
    on.reserve("a", 16)
    ids, _ = on.allocate(8, "a")
    on.mark_full(ids)
    assert on.plan_encode() is None  # no room that no reservation claims: the full pages wait, raw
    assert (on.page_state[ids] == PageState.FULL).all()
    on.allocate(8, "a")  # the reserved request still reaches its maximum
    check(on)


def test_an_encode_launch_has_room_once_compression_freed_it() -> None:
    """Unreserved room lets the first pages compress; once compression has freed more than compression
    off would have, a chunk per layer (4 pages here) is kept out of admission for the next launch."""
    led = ledger(layers=2, chunks=8)  # 16 pages
    led.reserve("a", 12)
    ids, _ = led.allocate(8, "a")
    led.mark_full(ids)
    plan = encode_with(led, lambda p: np.full(p.size, 3))  # 3/16 of a raw page each
    assert plan is not None and plan.size == 2 * 4  # 4 pages a layer, in the 4 unreserved places
    led.poll()
    assert led.held_margin_pages() == 0  # 4 raw slots freed, one LOG chunk taken: no gain over off yet
    while led.full_queue:
        assert encode_with(led, lambda p: np.full(p.size, 3)) is not None
        led.poll()
    while (move := led.plan_compaction(live_fraction=1.0)) is not None:  # pack the spread LOG places
        led.moved(move)
        led.poll()
    off_room = 8 // 2 * 4 - 8  # what compression off would offer now, reservations included
    assert led.held_margin_pages() == led.encode_margin_pages == 4
    assert led.headroom_pages() + led.reserved_pages >= off_room
    led.reserve("b", led.headroom_pages())
    more, _ = led.allocate(4, "a")
    led.mark_full(more)
    assert encode_with(led, lambda p: np.full(p.size, 3)) is not None  # the margin takes the launch
    check(led)


def test_sizes_are_taken_in_the_configured_unit() -> None:
    """Page format v3 stores pages in 64-byte steps: a 64-byte-unit ledger places them exactly, and a
    256-byte-unit one (v1/v2) refuses them rather than rounding."""
    for unit, accepted in ((64, True), (256, False)):
        led = ledger(layers=2, chunks=16, chunk_units=256, raw=64, unit_bytes=unit)
        ids, _ = led.allocate(2)
        led.mark_full(ids)
        plan = led.plan_encode()
        assert plan is not None
        sizes = np.array([64 * 49, 64 * 50] * 2, dtype=np.int64)  # 3136 and 3200 bytes: not 256-multiples
        led.launched(plan, CompletedFence(), lambda s=sizes: s)  # type: ignore[misc]
        if not accepted:
            with pytest.raises(RuntimeError, match="multiples of 256"):
                led.poll()
            continue
        led.poll()
        assert (led.page_units[:, ids] == [[49, 50], [49, 50]]).all()
        assert (np.diff(led.page_unit[:, ids], axis=1) == 49).all()  # packed back to back, in units
        check(led)
    with pytest.raises(ValueError, match="unit_bytes"):
        ledger(unit_bytes=0)
