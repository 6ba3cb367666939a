"""Compaction: move the live pages out of mostly-dead LOG chunks so the chunks can be reused.

Requests finish in any order, so compressed chunks collect dead bytes. A chunk whose live bytes are below
``compaction_live_fraction`` of it is a candidate; per layer, the candidates with the fewest live bytes are
packed into the layer's open LOG chunk (and new chunks when needed) as long as that frees more chunks than
it takes and every reservation stays honoured. The page table is updated to the new places; the emptied
chunks drain (device fence) before anyone can reuse them.

Planning only: the functions here read the ledger's state and return a ``LayerMove`` per layer;
``Ledger`` applies it (takes the chunks, updates its tables), so it alone writes its arrays.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from zipkv.allocator.chunks import ChunkTable
from zipkv.allocator.encode import chunks_affordable, most_affordable
from zipkv.allocator.plans import ChunkKind, MovePlan, PageState

I64 = np.int64


@dataclass(frozen=True)
class LayerMove:
    """One layer's compaction: ``pages`` leave ``emptied`` chunks and are packed behind the layer's bump
    pointer, in runs of pages that share a chunk.

    A run's chunk is a LOG chunk of the layer's room list, or ``-1 - j``: the j-th chunk the move takes
    (in order; every taken chunk but the last fills up, the last stays listed). ``popped``: entries the
    move fills up or skips, dropped from the top of the layer's room list.
    """

    layer: int
    pages: np.ndarray  # int64 [m]
    emptied: np.ndarray  # int64 [e]: the chunks being emptied
    popped: int
    new_chunks: int
    run_chunk: np.ndarray  # int64 [s]: chunk of each run (or a stand-in for a chunk to take)
    run_start_units: np.ndarray  # int64 [s]: the chunk's bump pointer where the run starts
    run_pages: np.ndarray  # int64 [s]: pages in each run
    offset_units: np.ndarray  # int64 [m]: each page's place in its run, from the run's start

    def destinations(self, chunks: np.ndarray, chunk_units: int) -> tuple[np.ndarray, np.ndarray]:
        """(unit offset, chunk) of every page once the runs' ``chunks`` are known (taken ones resolved)."""
        base = np.repeat(chunks * chunk_units + self.run_start_units, self.run_pages)
        return base + self.offset_units, np.repeat(chunks, self.run_pages)


def candidates(table: ChunkTable, live_fraction: float | None = None) -> np.ndarray:
    """LOG chunks with no encode in flight whose live bytes are below the threshold of the chunk
    (``live_fraction``, default the pool's ``compaction_live_fraction``)."""
    fraction = table.cfg.compaction_live_fraction if live_fraction is None else live_fraction
    cut = math.ceil(fraction * table.cu)  # live < x <=> live < ceil(x) for ints
    mask = (table.chunk_kind == ChunkKind.LOG) & (table.chunk_pending == 0) & (table.chunk_live < cut)
    return np.flatnonzero(mask)


def layer_order(table: ChunkTable, cands: np.ndarray, max_layers: int) -> list[int]:
    """At most ``max_layers`` layers that have candidates, those with the most candidate chunks first."""
    per_layer = np.bincount(table.chunk_owner[cands], minlength=table.cfg.num_layers)
    top = min(max_layers, int(np.count_nonzero(per_layer)))
    return np.argsort(-per_layer, kind="stable")[:top].tolist()  # type: ignore[no-any-return]


def _select(
    table: ChunkTable,
    layer: int,
    chunks: np.ndarray,
    chunk_pages: np.ndarray,
    max_pages: int,
    max_new_chunks: int,
) -> tuple[np.ndarray, int]:
    """The prefix of ``chunks`` (fewest live first) that frees the most chunks while moving at most
    ``max_pages`` pages (``chunk_pages``: live pages of each of ``chunks``) into at most ``max_new_chunks``
    new chunks; and the new chunks it needs. Both bounds cut the prefix rather than drop the layer: on a
    full pool whose dead bytes are spread over every chunk, the best move may need more new chunks than
    are free or more pages than a pass moves, while a shorter one frees a chunk and makes room for the
    next (before, nothing moved, and a reclaim under pressure found no room however much it evicted)."""
    live = table.chunk_live[chunks]
    order = np.argsort(live, kind="stable")
    within = int(np.searchsorted(np.cumsum(chunk_pages[order]), max_pages, side="right"))
    order = order[:within]
    if order.size == 0:
        return chunks[:0], 0
    chunks, total = chunks[order], np.cumsum(live[order])
    # A page never straddles chunks, so a tail of r units takes at least r - raw + 1 units of moved pages
    # and a new chunk at least cu - raw + 1: an upper bound on the new chunks the move takes. Tails of
    # candidate chunks do not count (they are being emptied).
    emptied = set(chunks.tolist())
    rooms = np.array([c for c in table.log_rooms[layer] if c not in emptied], dtype=I64)
    tails = int(np.maximum(table.cu - table.chunk_bump[rooms] - table.raw + 1, 0).sum())
    need = -(-np.maximum(total - tails, 0) // (table.cu - table.raw + 1))
    gain = np.where(need <= max_new_chunks, np.arange(1, chunks.size + 1) - need, 0)
    best = int(np.argmax(gain))
    if gain[best] <= 0:
        return chunks[:0], 0
    return chunks[: best + 1], int(need[best])


def plan_layer(
    table: ChunkTable,
    layer: int,
    cands: np.ndarray,
    page_chunk: np.ndarray,
    page_units: np.ndarray,
    page_state: np.ndarray,
    max_pages: int,
) -> LayerMove | None:
    """The move of at most ``max_pages`` pages that empties the most of ``layer``'s candidate chunks (None:
    none pays or is affordable). ``page_chunk`` and ``page_units`` are the layer's rows of the ledger's
    tables."""
    mine = cands[table.chunk_owner[cands] == layer]
    if mine.size == 0:
        return None
    # pages of each chunk (page_chunk is -1 for a page not placed in this layer's chunks)
    per_chunk = np.bincount(page_chunk[page_chunk >= 0], minlength=table.cfg.num_chunks)[mine]
    chunks, new_chunks = _select(table, layer, mine, per_chunk, max_pages, table.cfg.num_chunks)
    need = np.zeros(table.cfg.num_layers, dtype=I64)
    need[layer] = new_chunks
    if chunks.size and not chunks_affordable(table, need):  # the best move does not fit: the best that does
        chunks, _ = _select(table, layer, mine, per_chunk, max_pages, _affordable_new_chunks(table, layer))
    if chunks.size == 0:
        return None
    selected = np.zeros(table.cfg.num_chunks + 1, dtype=bool)  # the extra entry answers page_chunk == -1
    selected[chunks] = True
    pages = selected.take(page_chunk).nonzero()[0]
    if np.any(page_state[pages] != PageState.COMPRESSED):
        raise AssertionError("compaction picked a page whose size is not known (internal)")
    return _pack(table, layer, pages, chunks, page_units[pages])


def _affordable_new_chunks(table: ChunkTable, layer: int) -> int:
    """Most new chunks ``layer`` can take now and still honour every reservation; -1 when not even none
    can (the reservations already exceed what fits)."""

    def need(n: int) -> np.ndarray:
        out = np.zeros(table.cfg.num_layers, dtype=I64)
        out[layer] = n
        return out

    if not chunks_affordable(table, need(0)):
        return -1
    return most_affordable(table, need, table.cfg.num_chunks)


def _pack(
    table: ChunkTable, layer: int, pages: np.ndarray, emptied: np.ndarray, sizes: np.ndarray
) -> LayerMove:
    """Pack ``pages`` behind the layer's bump pointer: the room list's chunks from the top (those being
    emptied left out), then new chunks, each run as long as the chunk's tail takes."""
    gone = set(emptied.tolist())
    rooms = [c for c in table.log_rooms[layer] if c not in gone]  # a chunk being emptied takes no pages
    listed, new_chunks = len(rooms), 0
    bump = {c: int(table.chunk_bump[c]) for c in rooms}
    ends = np.cumsum(sizes)
    end_list, cu, raw = ends.tolist(), table.cu, table.raw
    stops, run_chunk, run_start = [0], [], []
    start = before = 0
    while start < len(end_list):
        while rooms and (cu - bump[rooms[-1]]) // raw == 0:  # a full tail: retire it
            rooms.pop()
        if not rooms:
            c = -1 - new_chunks
            new_chunks += 1
            rooms.append(c)
            bump[c] = 0
        c = rooms[-1]
        stop = bisect_right(end_list, before + cu - bump[c], lo=start)
        if stop == start:  # the next page is larger than this tail: retire the tail
            rooms.pop()
            continue
        stops.append(stop)
        run_chunk.append(c)
        run_start.append(bump[c])
        bump[c] += end_list[stop - 1] - before
        start, before = stop, end_list[stop - 1]
    kept = sum(1 for c in rooms if c >= 0)
    runs = np.array(stops[1:], dtype=I64) - np.array(stops[:-1], dtype=I64)
    first = np.repeat(np.array(stops[:-1], dtype=I64), runs)
    offsets = ends - sizes - np.concatenate(([0], ends))[first]
    return LayerMove(
        layer=layer,
        pages=pages,
        emptied=emptied,
        popped=listed - kept,
        new_chunks=new_chunks,
        run_chunk=np.array(run_chunk, dtype=I64),
        run_start_units=np.array(run_start, dtype=I64),
        run_pages=runs,
        offset_units=offsets,
    )


def move_plan(parts: list[tuple[LayerMove, np.ndarray, np.ndarray, np.ndarray]]) -> MovePlan:
    """The device's copy of the applied moves: (move, source units, size units, destination units)."""
    return MovePlan(
        layers=np.concatenate([np.full(m.pages.size, m.layer, dtype=I64) for m, _, _, _ in parts]),
        pages=np.concatenate([m.pages for m, _, _, _ in parts]),
        src_units=np.concatenate([src for _, src, _, _ in parts]),
        dst_units=np.concatenate([dst for _, _, _, dst in parts]),
        size_units=np.concatenate([size for _, _, size, _ in parts]),
        emptied_chunks=np.concatenate([m.emptied for m, _, _, _ in parts]),
    )
