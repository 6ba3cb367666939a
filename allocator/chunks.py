"""Chunks of the heap, host side: who owns each, what it holds, free raw slots, LOG tails, draining.

A chunk is empty (in the shared pool, or held by one layer when there is no pool), a RAW chunk of fixed
slots for uncompressed pages, or a LOG chunk where compressed pages sit one after another behind a bump
pointer; an emptied chunk drains (its fence) before it is reused. ``PageTable`` (page_table.py) builds the
page bookkeeping on top of this table, ``Ledger`` (ledger.py) the pages that move.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from zipkv.allocator import capacity
from zipkv.allocator.plans import (
    ChunkKind,
    CompletedFence,
    Fence,
    LedgerConfig,
    OutOfPages,
    RegionLayout,
    unique_sorted,
)

I64 = np.int64


class ChunkTable:
    _fit: int | None  # cached headroom_pages(); None when something changed
    reserved_pages: int

    def __init__(self, cfg: LedgerConfig, new_fence: Callable[[], Fence] = CompletedFence) -> None:
        self.cfg, self.new_fence = cfg, new_fence
        n_l, n_c = cfg.num_layers, cfg.num_chunks
        self.raw, self.cu = cfg.raw_page_units, cfg.chunk_units
        self.slots_per_chunk = self.cu // self.raw
        self.chunk_owner = np.full(n_c, -1, dtype=I64)
        self.chunk_kind = np.zeros(n_c, dtype=np.int8)
        self.chunk_live = np.zeros(n_c, dtype=I64)  # units of live pages (worst case while encoding)
        self.chunk_bump = np.zeros(n_c, dtype=I64)  # LOG: units handed out from the chunk's start
        self.chunk_pending = np.zeros(n_c, dtype=I64)  # LOG: encode regions whose sizes are not back
        # Free raw slots (unit offsets) of each layer, a stack per row: row l holds free_slots[l] of them,
        # top last. One array so that every layer pushes and pops in one numpy call; it grows on demand.
        self.slot_stack = np.zeros((n_l, 2 * self.slots_per_chunk), dtype=I64)
        self.free_slots = np.zeros(n_l, dtype=I64)
        self._rows = np.arange(n_l, dtype=I64)[:, None]
        self._slot_offsets = self.cu - self.raw - self.raw * np.arange(self.slots_per_chunk, dtype=I64)
        self._chunk_flag = np.zeros(n_c, dtype=bool)  # scratch, all False between calls
        self.private_empty: list[list[int]] = [[] for _ in range(n_l)]
        self.pool: list[int] = []
        if cfg.shared_pool:
            self.pool = list(range(n_c - 1, -1, -1))
        else:  # each layer owns an equal share for good; a remainder of chunks stays unused
            share = n_c // n_l
            for layer in range(n_l):
                own = list(range((layer + 1) * share - 1, layer * share - 1, -1))
                self.private_empty[layer] = own
                self.chunk_owner[own] = layer
        # LOG chunks of each layer with room for at least one worst-case page; the top is used first
        self.log_rooms: list[list[int]] = [[] for _ in range(n_l)]
        self.in_rooms = np.zeros(n_c, dtype=bool)
        self.draining: deque[tuple[Fence, np.ndarray]] = deque()
        self.idle_raw: set[int] = set()  # empty RAW chunks kept back so that reservations stay covered
        self.reservations: dict[str, int] = {}
        self.reserved_pages = 0
        self._fit = None

    # ---- capacity ----------------------------------------------------------------------------------
    def free_units(self) -> np.ndarray:
        """Units each layer can put new pages in without the pool."""
        units = self.free_slots * self.raw
        if not self.cfg.shared_pool:
            units = units + np.array([len(e) for e in self.private_empty], dtype=I64) * self.cu
        return units

    def fits(self, total_pages: int, free_units: np.ndarray | None = None, pool: int | None = None) -> bool:
        return capacity.fits(
            self.free_units() if free_units is None else free_units,
            total_pages,
            self.raw,
            self.cu,
            len(self.pool) if pool is None else pool,
            self.cfg.shared_pool,
        )

    # ---- free raw slots ----------------------------------------------------------------------------
    @property
    def slots(self) -> list[list[int]]:
        """Free raw slots of each layer, bottom of the stack first (a copy, for checks and tests)."""
        return [row[:h].tolist() for row, h in zip(self.slot_stack, self.free_slots.tolist(), strict=True)]

    def _slot_room(self, height: int) -> None:
        """Make every row of the slot stack hold at least ``height`` slots."""
        width = self.slot_stack.shape[1]
        if height > width:
            grown = np.zeros((self.cfg.num_layers, max(height, 2 * width)), dtype=I64)
            grown[:, :width] = self.slot_stack
            self.slot_stack = grown

    def _push_slots(self, units: np.ndarray) -> None:
        """Push ``units`` (int64 [L, k]) onto every layer's stack, column 0 first."""
        k = units.shape[1]
        self._slot_room(int(self.free_slots.max()) + k)
        self.slot_stack[self._rows, self.free_slots[:, None] + np.arange(k)] = units
        self.free_slots += k

    def _pop_slots(self, n: int) -> np.ndarray:
        """Pop ``n`` slots from every layer's stack -> int64 [L, n], top first."""
        self.free_slots -= n
        return self.slot_stack[self._rows, self.free_slots[:, None] + np.arange(n - 1, -1, -1)]

    def _push_chunk_slots(self, layers: np.ndarray, chunks: np.ndarray) -> None:
        """New RAW ``chunks`` (int64 [m]) of ``layers`` (int64 [m], in order): their slots go on top, the
        chunk's first slot on top of all."""
        spc = self.slots_per_chunk
        per_layer = np.bincount(layers, minlength=self.cfg.num_layers)
        nth = np.arange(layers.size, dtype=I64) - (np.cumsum(per_layer) - per_layer)[layers]
        self._slot_room(int((self.free_slots + per_layer * spc).max()))
        cols = (self.free_slots[layers] + nth * spc)[:, None] + np.arange(spc)
        self.slot_stack[layers[:, None], cols] = chunks[:, None] * self.cu + self._slot_offsets
        self.free_slots += per_layer * spc

    def _drop_chunk_slots(self, layers: np.ndarray, chunks: np.ndarray) -> None:
        """Remove the slots of ``chunks`` from the stacks of ``layers`` (both int64 [m]), keeping order."""
        rows = unique_sorted(layers)
        heights = self.free_slots[rows]
        block = self.slot_stack[rows, : int(heights.max())]
        self._chunk_flag[chunks] = True
        keep = (np.arange(block.shape[1]) < heights[:, None]) & ~self._chunk_flag[block // self.cu]
        self._chunk_flag[chunks] = False
        cols = np.cumsum(keep, axis=1) - 1
        self.slot_stack[np.broadcast_to(rows[:, None], block.shape)[keep], cols[keep]] = block[keep]
        self.free_slots[rows] = keep.sum(axis=1)

    # ---- chunks ------------------------------------------------------------------------------------
    def _take_chunk(self, layer: int, kind: int) -> int:
        source = self.pool if self.cfg.shared_pool else self.private_empty[layer]
        if not source:  # callers check capacity first, so this is a bookkeeping bug
            raise OutOfPages(f"layer {layer} needs a chunk and none is free (internal: capacity was checked)")
        c = source.pop()
        self.chunk_owner[c], self.chunk_kind[c], self.chunk_bump[c] = layer, kind, 0
        if kind == ChunkKind.RAW:
            self._push_chunk_slots(np.array([layer], dtype=I64), np.array([c], dtype=I64))
        return c

    def _take_chunks(self, layers: np.ndarray, kind: int) -> np.ndarray:
        """``_take_chunk`` for each of ``layers`` (int64 [m], in that order) at once; the chunks taken."""
        if not self.cfg.shared_pool or layers.size == 0:
            return np.array([self._take_chunk(layer, kind) for layer in layers.tolist()], dtype=I64)
        m = int(layers.size)
        if m > len(self.pool):  # callers check capacity first, so this is a bookkeeping bug
            raise OutOfPages(
                f"layers need {m} chunks and {len(self.pool)} are free (internal: capacity was checked)"
            )
        taken = np.array(self.pool[: -m - 1 : -1], dtype=I64)  # the order single pops would give
        del self.pool[-m:]
        self.chunk_owner[taken], self.chunk_kind[taken], self.chunk_bump[taken] = layers, kind, 0
        if kind == ChunkKind.RAW:
            self._push_chunk_slots(layers, taken)
        return taken

    def _retire_empty(self, chunks: np.ndarray) -> None:
        """Chunks that hold nothing start draining: reusable once reads issued so far are done."""
        chunks = unique_sorted(chunks[self.chunk_live[chunks] == 0])
        kind = self.chunk_kind[chunks]
        in_use = (kind == ChunkKind.RAW) | (kind == ChunkKind.LOG)
        empty = chunks[(self.chunk_live[chunks] == 0) & (self.chunk_pending[chunks] == 0) & in_use]
        if empty.size == 0:
            return
        owners, kinds = self.chunk_owner[empty], self.chunk_kind[empty]
        raw = kinds == ChunkKind.RAW
        if raw.any():
            # A RAW chunk's free slots count as capacity now and again once it has drained, but not while
            # it drains: keep it (empty, in its layer) if that gap would break a reservation.
            lost = np.bincount(owners[raw], minlength=self.cfg.num_layers) * self.cu
            if not self.fits(self.reserved_pages, free_units=self.free_units() - lost):
                self.idle_raw.update(empty[raw].tolist())
                empty, owners, raw = empty[~raw], owners[~raw], raw[~raw]
                if empty.size == 0:
                    return
            else:
                self.idle_raw.difference_update(empty[raw].tolist())
        if raw.any():
            self._drop_chunk_slots(owners[raw], empty[raw])
        listed = empty[~raw & self.in_rooms[empty]]
        for c, layer in zip(listed.tolist(), self.chunk_owner[listed].tolist(), strict=True):
            self.log_rooms[layer].remove(c)
        self.in_rooms[listed] = False
        self.chunk_kind[empty] = ChunkKind.DRAINING
        self.draining.append((self.new_fence(), empty))
        self._fit = None

    def open_regions(self, layout: RegionLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Take and list the chunks of an encode launch's ``layout`` and hand out its worst-case places:
        (base units, page count, chunk) of each region."""
        chunk = layout.chunk.copy()
        new = chunk < 0
        if new.any():
            chunk[new] = self._take_chunks(layout.owner[new], ChunkKind.LOG)
        if layout.popped.size:
            self.in_rooms[layout.popped] = False
            drop = np.bincount(self.chunk_owner[layout.popped], minlength=self.cfg.num_layers)
            for layer in np.flatnonzero(drop).tolist():
                del self.log_rooms[layer][-int(drop[layer]) :]
        for layer, c in zip(layout.owner[layout.stays].tolist(), chunk[layout.stays].tolist(), strict=True):
            self.log_rooms[layer].append(c)
        self.in_rooms[chunk[layout.stays]] = True
        base = chunk * self.cu + self.chunk_bump[chunk]
        self.chunk_bump[chunk] += layout.count * self.raw
        self.chunk_live[chunk] += layout.count * self.raw  # a chunk takes at most one region per launch
        self.chunk_pending[chunk] += 1
        return base, layout.count, chunk

    def offer_room(self, chunks: np.ndarray) -> None:
        """LOG chunks whose bump pointer moved back: their tails take pages again."""
        back = (self.chunk_kind[chunks] == ChunkKind.LOG) & (self.cu - self.chunk_bump[chunks] >= self.raw)
        chunks = chunks[back & ~self.in_rooms[chunks]]
        if chunks.size == 0:
            return
        owners = self.chunk_owner[chunks]
        order = np.argsort(owners, kind="stable")
        per_layer = np.bincount(owners, minlength=self.cfg.num_layers)
        ends, listed = np.cumsum(per_layer).tolist(), chunks[order].tolist()
        for layer in np.flatnonzero(per_layer).tolist():
            # under the chunk being filled (used once it is full); each goes under those offered before it
            self.log_rooms[layer][:0] = listed[ends[layer] - int(per_layer[layer]) : ends[layer]][::-1]
        self.in_rooms[chunks] = True

    def _drain(self) -> None:
        if self.idle_raw:
            idle = np.fromiter(self.idle_raw, dtype=I64)
            still = (self.chunk_kind[idle] == ChunkKind.RAW) & (self.chunk_live[idle] == 0)
            self.idle_raw = set(idle[still].tolist())
            self._retire_empty(idle[still])
        while self.draining and self.draining[0][0].done():
            _, chunks = self.draining.popleft()
            self.chunk_kind[chunks], self.chunk_bump[chunks] = ChunkKind.FREE, 0
            if self.cfg.shared_pool:
                self.chunk_owner[chunks] = -1
                self.pool.extend(chunks.tolist())
            else:
                for c, layer in zip(chunks.tolist(), self.chunk_owner[chunks].tolist(), strict=True):
                    self.private_empty[layer].append(c)
            self._fit = None
