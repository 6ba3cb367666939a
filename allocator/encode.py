"""Online compression, host side: plan one encode launch for every full page, apply sizes a step later.

The compressed size of a page is known on the device only after the encode kernel runs, and the decode
path must not wait for it. So each page gets a worst-case (raw-size) place in its layer's log chunk; the
device packs the encoded pages of a region one after another at once, and the host learns the sizes when
the launch's fence is done (the next step). Then it refunds the unused tail of each region (the chunk's
bump pointer rolls back when nothing was placed after it; otherwise the tail is dead space for
compaction) and frees the pages' raw slots. Until then capacity counts the worst case: it lags by one
step and is never optimistic.

Planning only: the functions here read the ledger's state and return what to change (a region layout,
an ``EncodePlan``, a ``Settlement``); ``Ledger`` applies them, so it alone writes its arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zipkv.allocator.chunks import ChunkTable
from zipkv.allocator.plans import EncodePlan, RegionLayout, packed_units

I64 = np.int64
NO_CHUNKS = np.zeros(0, dtype=I64)


@dataclass(frozen=True)
class Settlement:
    """What a finished launch's sizes change: exact places, refunded tails, the live bytes per region."""

    rewound_chunks: np.ndarray  # int64 [q]: region chunks whose bump pointer rolls back to the true end
    rewound_bump_units: np.ndarray  # int64 [q]: their new bump pointers
    region_live_units: np.ndarray  # int64 [r]: change of each region chunk's live units
    layers: np.ndarray  # int64 [a]: the (layer, page) pairs still alive, now compressed
    pages: np.ndarray  # int64 [a]
    units: np.ndarray  # int64 [a]: where each one lies, packed
    size_units: np.ndarray  # int64 [a]: its stored size


def _tops(table: ChunkTable) -> np.ndarray:
    return np.array([r[-1] if r else -1 for r in table.log_rooms], dtype=I64)


def _tops_take(table: ChunkTable, pages: int) -> bool:
    """Whether every layer's top LOG chunk has room for ``pages`` worst-case pages (the common case)."""
    tops = _tops(table)
    return bool((tops >= 0).all() and ((table.cu - table.chunk_bump[tops]) // table.raw >= pages).all())


def log_chunks_needed(table: ChunkTable, pages: int) -> np.ndarray:
    """New LOG chunks each layer needs to place ``pages`` worst-case pages (int64 [L])."""
    if _tops_take(table, pages):
        return np.zeros(table.cfg.num_layers, dtype=I64)
    listed = np.array([c for r in table.log_rooms for c in r], dtype=I64)
    owners = table.chunk_owner[listed]
    room = (table.cu - table.chunk_bump[listed]) // table.raw
    have = np.bincount(owners, room, table.cfg.num_layers).astype(I64)
    return -(-np.maximum(pages - have, 0) // table.slots_per_chunk)


def chunks_affordable(table: ChunkTable, need: np.ndarray) -> bool:
    """Whether layers can take ``need`` more chunks and still honour every reservation."""
    if table.cfg.shared_pool:
        pool = len(table.pool) - int(need.sum())
        return pool >= 0 and table.fits(table.reserved_pages, pool=pool)
    have = np.array([len(e) for e in table.private_empty], dtype=I64)
    if (need > have).any():
        return False
    return table.fits(table.reserved_pages, free_units=table.free_units() - need * table.cu)


def most_affordable(table: ChunkTable, need_for: Callable[[int], np.ndarray], most: int) -> int:
    """The largest n in 0..``most`` whose chunk needs ``need_for(n)`` (new chunks per layer, growing with
    n) are affordable, bisected; 0 when no n above 0 is."""
    if chunks_affordable(table, need_for(most)):
        return most
    lo, hi = 0, most - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chunks_affordable(table, need_for(mid)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def encodable(table: ChunkTable, pages: int) -> int:
    """Most of ``pages`` whose worst-case places fit without eating into reservations."""
    return most_affordable(table, lambda n: log_chunks_needed(table, n), pages)


def region_layout(table: ChunkTable, k: int) -> RegionLayout:
    """The regions of a launch of ``k`` pages per layer, layer-major."""
    n_l = table.cfg.num_layers
    if _tops_take(table, k):  # the common case: one region per layer, in its top chunk
        return RegionLayout(
            np.arange(n_l, dtype=I64),
            _tops(table),
            np.full(n_l, k, dtype=I64),
            NO_CHUNKS,
            np.zeros(n_l, bool),
        )
    return _spanning_layout(table, k)


def _spanning_layout(table: ChunkTable, k: int) -> RegionLayout:
    """``region_layout`` when some layer's top chunk cannot take all ``k`` pages, all layers at once.

    Per layer the pages fill the room-list chunks from the top down, then new chunks from the pool (in
    layer order). A chunk is dropped from its list once full; a new chunk stays listed if it keeps room.
    Each layer's list is extended by enough stand-ins for new chunks (-1) to take all ``k`` pages.
    """
    n_l, cu, raw, spc = table.cfg.num_layers, table.cu, table.raw, table.slots_per_chunk
    rooms, spare = table.log_rooms, [-1] * -(-k // spc)
    listed = np.array([c for r in rooms for c in r[::-1] + spare], dtype=I64)  # layer-major, top first
    lens = np.array([len(r) for r in rooms], dtype=I64) + len(spare)
    owner = np.repeat(np.arange(n_l, dtype=I64), lens)
    real = listed >= 0
    room = np.where(real, (cu - table.chunk_bump[listed]) // raw, spc)
    above = np.cumsum(room) - room
    above -= above[np.cumsum(lens) - lens][owner]  # room above each entry in its layer's list
    cnt = np.minimum(np.maximum(k - above, 0), room)
    used = cnt > 0
    popped = real & (above < k) & (cnt == room)  # reached and filled (or had no room left)
    stays = ~real & (cnt < spc)  # the last new chunk of a layer, if it keeps room
    return RegionLayout(owner[used], listed[used], cnt[used], listed[popped], stays[used])


def page_places(
    table: ChunkTable,
    pages: np.ndarray,
    page_unit: np.ndarray,
    page_gen: np.ndarray,
    regions: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> EncodePlan:
    """The launch of ``pages`` over opened ``regions`` (base units, count, chunk): each (layer, page)
    pair's raw slot (from ``page_unit``) and worst-case stage place, layer-major."""
    base, count, chunk = regions
    k, n_l = int(pages.size), table.cfg.num_layers
    first = np.cumsum(count) - count
    segments = np.repeat(np.arange(count.size, dtype=I64), count)
    stage = base[segments] + (np.arange(k * n_l, dtype=I64) - first[segments]) * table.raw
    tiled = np.broadcast_to(pages, (n_l, k)).flatten()  # a copy: plans hold writable arrays
    return EncodePlan(
        layers=np.repeat(np.arange(n_l, dtype=I64), k),
        pages=tiled,
        src_units=page_unit[:, pages].reshape(-1),  # layer-major, as ``layers`` and ``pages``
        stage_units=stage,
        segments=segments,
        generations=page_gen[tiled],
        region_first=first,
        region_base_units=base,
        region_count=count,
        region_chunk=chunk,
    )


def settlement(
    table: ChunkTable, plan: EncodePlan, sizes_bytes: np.ndarray, page_gen: np.ndarray
) -> Settlement:
    """The sizes of a finished launch arrived: where its pages now lie and what the chunks give back."""
    sizes = np.asarray(sizes_bytes, dtype=I64).ravel()
    unit = table.cfg.unit_bytes
    raw_bytes = table.raw * unit
    if sizes.size != plan.size or (sizes % unit).any() or sizes.min() <= 0 or sizes.max() > raw_bytes:
        raise RuntimeError(
            f"encoder returned {sizes.size} sizes for {plan.size} pages, range {sizes.min()}..{sizes.max()}; "
            f"expected multiples of {unit} in (0, {raw_bytes}]: the encoder and PageFormat disagree"
        )
    su = sizes // unit
    packed = packed_units(su, plan.segments, plan.region_first, plan.region_base_units)
    c = plan.region_chunk
    true_end = plan.region_base_units + np.add.reduceat(su, plan.region_first)
    at_end = c * table.cu + table.chunk_bump[c] == plan.region_base_units + plan.region_count * table.raw
    alive = page_gen[plan.pages] == plan.generations
    # a live page of the batch is still in its region's chunk (compaction moves only compressed pages),
    # and a launch has at most one region per chunk: one sum per region
    live = np.add.reduceat(np.where(alive, su - table.raw, 0), plan.region_first)
    return Settlement(
        rewound_chunks=c[at_end],
        rewound_bump_units=true_end[at_end] - c[at_end] * table.cu,
        region_live_units=live,
        layers=plan.layers[alive],
        pages=plan.pages[alive],
        units=packed[alive],
        size_units=su[alive],
    )
