"""Online compression, host side: plan one encode launch for every full page, apply sizes a step later.

The compressed size of a page is known on the device only after the encode kernel runs, and the decode
path must not wait for it. So each page gets a worst-case (raw-size) place in its layer's log chunk; the
device packs the encoded pages of a region one after another at once, and the host learns the sizes when
the launch's fence is done (the next step). Then it refunds the unused tail of each region (the chunk's
bump pointer rolls back when nothing was placed after it; otherwise the tail is dead space for
compaction) and frees the pages' raw slots. Until then capacity counts the worst case: it lags by one
step and is never optimistic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from zipkv.allocator.plans import (
    ChunkKind,
    EncodeBatch,
    EncodePlan,
    Fence,
    PageState,
    packed_units,
    unique_sorted,
)

if TYPE_CHECKING:
    from zipkv.allocator.ledger import Ledger

I64 = np.int64


def _tops(led: Ledger) -> np.ndarray:
    return np.array([r[-1] if r else -1 for r in led.log_rooms], dtype=I64)


def log_chunks_needed(led: Ledger, pages: int) -> np.ndarray:
    """New LOG chunks each layer needs to place ``pages`` worst-case pages (int64 [L])."""
    tops = _tops(led)
    if (tops >= 0).all() and ((led.cu - led.chunk_bump[tops]) // led.raw >= pages).all():
        return np.zeros(led.cfg.num_layers, dtype=I64)
    listed = np.array([c for r in led.log_rooms for c in r], dtype=I64)
    owners = led.chunk_owner[listed]
    room = np.bincount(owners, (led.cu - led.chunk_bump[listed]) // led.raw, led.cfg.num_layers).astype(I64)
    return -(-np.maximum(pages - room, 0) // led.slots_per_chunk)


def chunks_affordable(led: Ledger, need: np.ndarray) -> bool:
    """Whether layers can take ``need`` more chunks and still honour every reservation."""
    if led.cfg.shared_pool:
        pool = len(led.pool) - int(need.sum())
        return pool >= 0 and led._fits(led.reserved_pages, pool=pool)
    have = np.array([len(e) for e in led.private_empty], dtype=I64)
    if (need > have).any():
        return False
    return led._fits(led.reserved_pages, free_units=led.free_units() - need * led.cu)


def _encodable(led: Ledger, pages: int) -> int:
    """Most of ``pages`` whose worst-case places fit without eating into reservations."""
    if chunks_affordable(led, log_chunks_needed(led, pages)):
        return pages
    lo, hi = 0, pages - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chunks_affordable(led, log_chunks_needed(led, mid)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_encode(led: Ledger) -> EncodePlan | None:
    """Take the queued full pages (as many as fit now) and give each a worst-case place per layer."""
    if not led.full_queue:
        return None
    queue = unique_sorted(np.asarray(led.full_queue, dtype=I64))
    queue = queue[led.page_state[queue] == PageState.FULL]
    k = _encodable(led, int(queue.size))
    led.full_queue = queue[k:].tolist()  # the rest waits for room (they stay valid raw pages)
    if k == 0:
        return None
    return _place(led, queue[:k])


def _regions(led: Ledger, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base units, page count, chunk) of each region, layer-major; advances bump pointers."""
    n_l = led.cfg.num_layers
    tops = _tops(led)
    if (tops >= 0).all() and ((led.cu - led.chunk_bump[tops]) // led.raw >= k).all():
        base = tops * led.cu + led.chunk_bump[tops]  # the common case: one region per layer
        led.chunk_bump[tops] += k * led.raw
        led.chunk_live[tops] += k * led.raw
        led.chunk_pending[tops] += 1
        return base, np.full(n_l, k, dtype=I64), tops
    return _spanning_regions(led, k)


def _spanning_regions(led: Ledger, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_regions`` when some layer's top chunk cannot take all ``k`` pages, all layers at once.

    Per layer the pages fill the room-list chunks from the top down, then new chunks from the pool (in
    layer order). A chunk is dropped from its list once full; a new chunk stays listed if it keeps room.
    Each layer's list is extended by enough stand-ins for new chunks (-1) to take all ``k`` pages.
    """
    n_l, cu, raw, spc = led.cfg.num_layers, led.cu, led.raw, led.slots_per_chunk
    rooms, spare = led.log_rooms, [-1] * -(-k // spc)
    listed = np.array([c for r in rooms for c in r[::-1] + spare], dtype=I64)  # layer-major, top first
    lens = np.array([len(r) for r in rooms], dtype=I64) + len(spare)
    owner = np.repeat(np.arange(n_l, dtype=I64), lens)
    real = listed >= 0
    room = np.where(real, (cu - led.chunk_bump[listed]) // raw, spc)
    above = np.cumsum(room) - room
    above -= above[np.cumsum(lens) - lens][owner]  # room above each entry in its layer's list
    cnt = np.minimum(np.maximum(k - above, 0), room)
    used = cnt > 0
    new = used & ~real
    listed[new] = led._take_chunks(owner[new], ChunkKind.LOG)
    popped = real & (above < k) & (cnt == room)  # reached and filled (or had no room left)
    stays = new & (cnt < spc)  # the last new chunk of a layer, if it keeps room
    led.in_rooms[listed[popped]] = False
    drop = np.bincount(owner[popped], minlength=n_l)
    for layer in np.flatnonzero(drop).tolist():
        del rooms[layer][-int(drop[layer]) :]
    for layer, c in zip(owner[stays].tolist(), listed[stays].tolist(), strict=True):
        rooms[layer].append(c)
    led.in_rooms[listed[stays]] = True
    chunk, count = listed[used], cnt[used]
    base = chunk * cu + led.chunk_bump[chunk]
    led.chunk_bump[chunk] += count * raw
    led.chunk_live[chunk] += count * raw  # a chunk takes at most one region per launch
    led.chunk_pending[chunk] += 1
    return base, count, chunk


def _place(led: Ledger, pages: np.ndarray) -> EncodePlan:
    k, n_l = int(pages.size), led.cfg.num_layers
    base, count, chunk = _regions(led, k)
    first = np.cumsum(count) - count
    segments = np.repeat(np.arange(count.size, dtype=I64), count)
    stage = base[segments] + (np.arange(k * n_l, dtype=I64) - first[segments]) * led.raw
    layers = np.repeat(np.arange(n_l, dtype=I64), k)
    tiled = np.broadcast_to(pages, (n_l, k)).flatten()  # a copy: plans hold writable arrays
    src = led.page_unit[:, pages].reshape(-1)  # layer-major, as ``layers`` and ``tiled``
    led.page_unit[:, pages] = stage.reshape(n_l, k)
    led.page_chunk[:, pages] = chunk[segments].reshape(n_l, k)
    led.page_state[pages] = PageState.ENCODING
    led._fit = None
    return EncodePlan(
        layers=layers,
        pages=tiled,
        src_units=src,
        stage_units=stage,
        segments=segments,
        generations=led.page_gen[tiled],
        region_first=first,
        region_base_units=base,
        region_count=count,
        region_chunk=chunk,
    )


def launched(led: Ledger, plan: EncodePlan, fence: Fence, read_sizes: Callable[[], np.ndarray]) -> None:
    led.batches.append(EncodeBatch(plan, fence, read_sizes))


def poll(led: Ledger) -> None:
    while led.batches and led.batches[0].fence.done():
        batch = led.batches.popleft()
        apply_batch(led, batch.plan, batch.read_sizes())
    led._drain()


def apply_batch(led: Ledger, plan: EncodePlan, sizes_bytes: np.ndarray) -> None:
    """The sizes of a finished launch arrived: place pages exactly, refund tails, free raw slots."""
    sizes = np.asarray(sizes_bytes, dtype=I64).ravel()
    unit = led.cfg.unit_bytes
    raw_bytes = led.raw * unit
    if sizes.size != plan.size or (sizes % unit).any() or sizes.min() <= 0 or sizes.max() > raw_bytes:
        raise RuntimeError(
            f"encoder returned {sizes.size} sizes for {plan.size} pages, range {sizes.min()}..{sizes.max()}; "
            f"expected multiples of {unit} in (0, {raw_bytes}]: the encoder and PageFormat disagree"
        )
    su = sizes // unit
    packed = packed_units(su, plan.segments, plan.region_first, plan.region_base_units)
    c = plan.region_chunk
    true_end = plan.region_base_units + np.add.reduceat(su, plan.region_first)
    at_end = c * led.cu + led.chunk_bump[c] == plan.region_base_units + plan.region_count * led.raw
    led.chunk_bump[c[at_end]] = true_end[at_end] - c[at_end] * led.cu
    led.offer_room(c[at_end])
    np.subtract.at(led.chunk_pending, c, 1)
    alive = led.page_gen[plan.pages] == plan.generations
    lay, pg = plan.layers[alive], plan.pages[alive]
    # a live page of the batch is still in its region's chunk (compaction moves only compressed pages),
    # and a launch has at most one region per chunk: one sum per region
    led.chunk_live[c] += np.add.reduceat(np.where(alive, su - led.raw, 0), plan.region_first)
    led.page_unit[lay, pg], led.page_units[lay, pg] = packed[alive], su[alive]
    led.page_state[pg] = PageState.COMPRESSED
    led._free_slots(plan.src_units.reshape(led.cfg.num_layers, -1))
    led._retire_empty(np.concatenate([c, plan.src_units // led.cu]))
    led._fit = None
