"""Compaction: move the live pages out of mostly-dead LOG chunks so the chunks can be reused.

Requests finish in any order, so compressed chunks collect dead bytes. A chunk whose live bytes are below
``compaction_live_fraction`` of it is a candidate; per layer, the candidates with the fewest live bytes are
packed into the layer's open LOG chunk (and new chunks when needed) as long as that frees more chunks than
it takes and every reservation stays honoured. The page table is updated to the new places; the emptied
chunks drain (device fence) before anyone can reuse them.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np

from zipkv.allocator.encode import chunks_affordable
from zipkv.allocator.plans import ChunkKind, MovePlan, PageState

if TYPE_CHECKING:
    from zipkv.allocator.ledger import Ledger

I64 = np.int64


def candidates(led: Ledger, live_fraction: float | None = None) -> np.ndarray:
    """LOG chunks with no encode in flight whose live bytes are below the threshold of the chunk
    (``live_fraction``, default the pool's ``compaction_live_fraction``)."""
    fraction = led.cfg.compaction_live_fraction if live_fraction is None else live_fraction
    cut = math.ceil(fraction * led.cu)  # live < x <=> live < ceil(x) for ints
    mask = (led.chunk_kind == ChunkKind.LOG) & (led.chunk_pending == 0) & (led.chunk_live < cut)
    return np.flatnonzero(mask)


def _select(led: Ledger, layer: int, chunks: np.ndarray) -> tuple[np.ndarray, int]:
    """The prefix of ``chunks`` (fewest live first) that frees the most chunks; and new chunks it needs."""
    live = led.chunk_live[chunks]
    order = np.argsort(live, kind="stable")
    chunks, total = chunks[order], np.cumsum(live[order])
    # A page never straddles chunks, so a tail of r units takes at least r - raw + 1 units of moved pages
    # and a new chunk at least cu - raw + 1: an upper bound on the new chunks the move takes. Tails of
    # candidate chunks do not count (they are being emptied).
    emptied = set(chunks.tolist())
    rooms = np.array([c for c in led.log_rooms[layer] if c not in emptied], dtype=I64)
    tails = int(np.maximum(led.cu - led.chunk_bump[rooms] - led.raw + 1, 0).sum())
    need = -(-np.maximum(total - tails, 0) // (led.cu - led.raw + 1))
    gain = np.arange(1, chunks.size + 1) - need
    best = int(np.argmax(gain))
    if gain[best] <= 0:
        return chunks[:0], 0
    return chunks[: best + 1], int(need[best])


def plan_compaction(
    led: Ledger, max_pages: int, max_layers: int, live_fraction: float | None = None
) -> MovePlan | None:
    """Plan moves for at most ``max_pages`` (layer, page) pairs in at most ``max_layers`` layers (those with
    the most candidate chunks first); updates the host tables at once.

    The caller copies the bytes on the device and then calls ``Ledger.moved`` so that the emptied chunks
    start draining behind the copy.
    """
    cands = candidates(led, live_fraction)
    if cands.size == 0:
        return None
    n_l = led.cfg.num_layers
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    emptied: list[np.ndarray] = []
    budget = max_pages
    owners = led.chunk_owner[cands]
    per_layer = np.bincount(owners, minlength=n_l)
    layers = np.argsort(-per_layer, kind="stable")[: min(max_layers, int(np.count_nonzero(per_layer)))]
    selected = np.zeros(led.cfg.num_chunks + 1, dtype=bool)  # the extra entry answers page_chunk == -1
    for layer in layers.tolist():
        chunks, new_chunks = _select(led, layer, cands[owners == layer])
        if chunks.size == 0:
            continue
        need = np.zeros(n_l, dtype=I64)
        need[layer] = new_chunks
        if not chunks_affordable(led, need):
            continue
        selected[chunks] = True
        pages = selected.take(led.page_chunk[layer]).nonzero()[0]
        selected[chunks] = False
        if pages.size > budget:
            break
        budget -= pages.size
        for c in chunks.tolist():  # a chunk being emptied takes no pages
            if led.in_rooms[c]:
                led.log_rooms[layer].remove(c)
                led.in_rooms[c] = False
        parts.append((layer, pages, led.page_unit[layer, pages].copy(), led.page_units[layer, pages].copy()))
        _place(led, layer, pages)
        emptied.append(chunks)
    if not parts:
        return None
    layers = np.concatenate([np.full(p.size, layer, dtype=I64) for layer, p, _, _ in parts])
    pages = np.concatenate([p for _, p, _, _ in parts])
    return MovePlan(
        layers=layers,
        pages=pages,
        src_units=np.concatenate([s for _, _, s, _ in parts]),
        dst_units=led.page_unit[layers, pages],
        size_units=np.concatenate([z for _, _, _, z in parts]),
        emptied_chunks=np.concatenate(emptied),
    )


def _place(led: Ledger, layer: int, pages: np.ndarray) -> None:
    """Pack ``pages`` of ``layer`` behind the layer's bump pointer, opening chunks as needed."""
    if np.any(led.page_state[pages] != PageState.COMPRESSED):
        raise AssertionError("compaction picked a page whose size is not known (internal)")
    sizes = led.page_units[layer, pages]
    old_chunks = led.page_chunk[layer, pages]
    ends = np.cumsum(sizes)
    end_list, cu = ends.tolist(), led.cu
    stops, seg_chunk, seg_base = [0], [], []  # runs of pages packed into one chunk, in plain ints
    start = before = 0
    while start < len(end_list):
        c = led.log_target(layer)
        bump = int(led.chunk_bump[c])
        stop = bisect_right(end_list, before + cu - bump, lo=start)
        if stop == start:  # the next page is larger than this tail: retire the tail
            led.log_rooms[layer].pop()
            led.in_rooms[c] = False
            continue
        stops.append(stop)
        seg_chunk.append(c)
        seg_base.append(c * cu + bump - before)
        led.chunk_bump[c] = bump + end_list[stop - 1] - before
        start, before = stop, end_list[stop - 1]
    runs = np.array(stops[1:], dtype=I64) - np.array(stops[:-1], dtype=I64)
    dst = np.repeat(np.array(seg_base, dtype=I64), runs) + ends - sizes
    dst_chunk = np.repeat(np.array(seg_chunk, dtype=I64), runs)
    np.add.at(led.chunk_live, old_chunks, -sizes)
    np.add.at(led.chunk_live, dst_chunk, sizes)
    led.page_unit[layer, pages], led.page_chunk[layer, pages] = dst, dst_chunk
    led._fit = None


def moved(led: Ledger, plan: MovePlan) -> None:
    """The device copy of ``plan`` is issued: its source chunks drain behind it."""
    led._retire_empty(plan.emptied_chunks)
