"""Host-side bookkeeping of the page pool: chunks, slots, page table mirror, reservations, and the pages
that move (the encode pipeline, compaction).

No torch here: everything is in units (``LedgerConfig.unit_bytes``) and numpy arrays, so it can be driven and
checked without a device (tests, the equal-memory concurrency simulation, the bookkeeping benchmark).
``PagePool`` (pool.py) wraps it, owns the device tensors and carries out its plans.

The layers below: ``ChunkTable`` (chunks.py) keeps the chunks, ``PageTable`` (page_table.py) the pages,
their allocation and freeing, reservations and the headroom. ``Ledger`` adds what moves pages: it applies
the plans of encode.py and compaction.py, which only read it. Every per-step operation is vectorised over
layers: a page id has a page in every layer, so allocating, freeing and compressing touch all layers at
once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from zipkv.allocator import compaction, encode
from zipkv.allocator.compaction import LayerMove
from zipkv.allocator.page_table import PageTable
from zipkv.allocator.plans import (
    ChunkKind,
    CompletedFence,
    EncodeBatch,
    EncodePlan,
    Fence,
    LedgerConfig,
    MovePlan,
    PageState,
    unique_sorted,
)

I64 = np.int64
# (layer, page) pairs one compaction pass moves at most: bounds a pass's device copy and host planning.
# Read at call time, so a test can make it bind on a small pool.
COMPACTION_MAX_PAGES = 2048

__all__ = ["Ledger", "LedgerConfig"]


class Ledger(PageTable):
    def __init__(self, cfg: LedgerConfig, new_fence: Callable[[], Fence] = CompletedFence) -> None:
        super().__init__(cfg, new_fence)
        self.batches: deque[EncodeBatch] = deque()

    # ---- the encode pipeline and compaction: encode.py and compaction.py plan, the ledger applies ----
    def plan_encode(self) -> EncodePlan | None:
        """Take the queued full pages (as many as fit now) and give each a worst-case place per layer."""
        if not self.full_queue:
            return None
        queue = unique_sorted(np.asarray(self.full_queue, dtype=I64))
        queue = queue[self.page_state[queue] == PageState.FULL]
        k = encode.encodable(self, int(queue.size))
        # the rest waits for room (they stay valid raw pages); in place: the list is PageTable's
        self.full_queue[:] = queue[k:].tolist()
        if k == 0:
            return None
        pages = queue[:k]
        regions = self.open_regions(encode.region_layout(self, k))
        plan = encode.page_places(self, pages, self.page_unit, self.page_gen, regions)
        n_l = self.cfg.num_layers
        self.page_unit[:, pages] = plan.stage_units.reshape(n_l, k)
        self.page_chunk[:, pages] = plan.region_chunk[plan.segments].reshape(n_l, k)
        self.page_state[pages] = PageState.ENCODING
        self._fit = None
        return plan

    def launched(self, plan: EncodePlan, fence: Fence, read_sizes: Callable[[], np.ndarray]) -> None:
        self.batches.append(EncodeBatch(plan, fence, read_sizes))

    def poll(self) -> None:
        """Apply encode batches and release draining chunks whose fences are done (never blocks)."""
        while self.batches and self.batches[0].fence.done():
            batch = self.batches.popleft()
            self.apply_sizes(batch.plan, batch.read_sizes())
        self._drain()

    def apply_sizes(self, plan: EncodePlan, sizes_bytes: np.ndarray) -> None:
        """The sizes of a finished launch arrived: place pages exactly, refund tails, free raw slots."""
        done = encode.settlement(self, plan, sizes_bytes, self.page_gen)
        c = plan.region_chunk
        self.chunk_bump[done.rewound_chunks] = done.rewound_bump_units
        self.offer_room(done.rewound_chunks)
        np.subtract.at(self.chunk_pending, c, 1)
        self.chunk_live[c] += done.region_live_units
        self.page_unit[done.layers, done.pages] = done.units
        self.page_units[done.layers, done.pages] = done.size_units
        self.page_state[done.pages] = PageState.COMPRESSED
        self._free_slots(plan.src_units.reshape(self.cfg.num_layers, -1))
        self._retire_empty(np.concatenate([c, plan.src_units // self.cu]))
        self._fit = None

    def plan_compaction(
        self, max_pages: int | None = None, max_layers: int = 1, live_fraction: float | None = None
    ) -> MovePlan | None:
        """Plan moves for at most ``max_pages`` (layer, page) pairs in at most ``max_layers`` layers (those
        with the most candidate chunks first); updates the host tables at once.

        The caller copies the bytes on the device and then calls ``moved`` so that the emptied chunks
        start draining behind the copy.
        """
        cands = compaction.candidates(self, live_fraction)
        if cands.size == 0:
            return None
        parts, budget = [], COMPACTION_MAX_PAGES if max_pages is None else max_pages
        for layer in compaction.layer_order(self, cands, max_layers):
            move = compaction.plan_layer(
                self, layer, cands, self.page_chunk[layer], self.page_units[layer], self.page_state, budget
            )
            if move is None:
                continue
            budget -= move.pages.size
            parts.append(self._apply_move(move))
            if budget <= 0:
                break
        return compaction.move_plan(parts) if parts else None

    def _apply_move(self, move: LayerMove) -> tuple[LayerMove, np.ndarray, np.ndarray, np.ndarray]:
        """Carry out one layer's move on the host tables -> (move, source units, sizes, destinations)."""
        layer, pages = move.layer, move.pages
        rooms = self.log_rooms[layer]
        for c in move.emptied[self.in_rooms[move.emptied]].tolist():  # a chunk being emptied takes no pages
            rooms.remove(c)
        self.in_rooms[move.emptied] = False
        for _ in range(move.popped):
            self.in_rooms[rooms.pop()] = False
        taken = self._take_chunks(np.full(move.new_chunks, layer, dtype=I64), ChunkKind.LOG)
        chunks = move.run_chunk
        if taken.size:
            rooms.append(int(taken[-1]))  # every chunk the move takes but the last fills up
            self.in_rooms[taken[-1]] = True
            chunks = np.where(chunks >= 0, chunks, taken[np.maximum(-1 - chunks, 0)])
        dst, dst_chunk = move.destinations(chunks, self.cu)
        src, sizes = self.page_unit[layer, pages].copy(), self.page_units[layer, pages].copy()
        np.add.at(self.chunk_live, self.page_chunk[layer, pages], -sizes)
        np.add.at(self.chunk_live, dst_chunk, sizes)
        ends = move.run_start_units + np.add.reduceat(sizes, np.cumsum(move.run_pages) - move.run_pages)
        self.chunk_bump[chunks] = ends
        self.page_unit[layer, pages], self.page_chunk[layer, pages] = dst, dst_chunk
        self._fit = None
        return move, src, sizes, dst

    def moved(self, plan: MovePlan) -> None:
        """The device copy of ``plan`` is issued: its source chunks drain behind it."""
        self._retire_empty(plan.emptied_chunks)
