"""Host-side bookkeeping of the page pool: chunks, slots, page table mirror, reservations.

No torch here: everything is in units (``LedgerConfig.unit_bytes``) and numpy arrays, so it can be driven and
checked without a device (tests, the admission simulation, the bookkeeping benchmark). ``PagePool``
(pool.py) wraps it, owns the device tensors and carries out its plans.

The chunks themselves are kept by ``ChunkTable`` (chunks.py). Every per-step operation is vectorised over
layers: a page id has a page in every layer, so allocating, freeing and compressing touch all layers at
once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from zipkv.allocator import capacity, compaction, encode
from zipkv.allocator.chunks import ChunkTable
from zipkv.allocator.compaction import LayerMove
from zipkv.allocator.plans import (
    ChunkKind,
    CompletedFence,
    EncodeBatch,
    EncodePlan,
    Fence,
    LedgerConfig,
    MovePlan,
    OutOfPages,
    PageState,
    unique_sorted,
)

I64 = np.int64

__all__ = ["Ledger", "LedgerConfig"]


class Ledger(ChunkTable):
    _fit: int | None

    def __init__(self, cfg: LedgerConfig, new_fence: Callable[[], Fence] = CompletedFence) -> None:
        super().__init__(cfg, new_fence)
        n_l, n_p = cfg.num_layers, cfg.max_pages
        self.batches: deque[EncodeBatch] = deque()
        self.page_state = np.zeros(n_p, dtype=np.int8)
        self.page_gen = np.zeros(n_p, dtype=I64)
        self.page_unit = np.full((n_l, n_p), -1, dtype=I64)
        self.page_units = np.zeros((n_l, n_p), dtype=I64)
        self.page_chunk = np.full((n_l, n_p), -1, dtype=I64)
        self.free_ids: list[int] = list(range(n_p - 1, -1, -1))
        self.full_queue: list[int] = []
        # The encode margin: room kept out of what new pages and reservations may take, so that an encode
        # launch can place its worst case (a new LOG chunk in every layer) while admission is full. It is
        # one chunk per layer at most, and held only out of room that compression has already freed
        # (held_margin_pages), so compression never leaves fewer new pages than compression off would.
        self.encode_margin_pages = self.slots_per_chunk if cfg.compression else 0
        self._margin_now = 0

    def headroom_pages(self) -> int:
        """New pages that fit in every layer after the reservations and the held margin; never optimistic."""
        if self._fit is None:
            ids_left = max(0, len(self.free_ids) - self.reserved_pages)
            room = capacity.pages_fit(
                self.free_units(), self.raw, self.cu, len(self.pool), 0, self.cfg.shared_pool
            )
            self._margin_now = min(self.encode_margin_pages, max(0, room - self._uncompressed_room()))
            self._fit = min(ids_left, max(0, room - self.reserved_pages - self._margin_now))
        return self._fit

    def held_margin_pages(self) -> int:
        """The encode margin held now: what compression freed beyond compression off's room, capped at
        ``encode_margin_pages``; 0 while nothing is compressed (idle headroom equals compression off's)."""
        self.headroom_pages()
        return self._margin_now

    def _uncompressed_room(self) -> int:
        """New pages (reservations included) that would fit if every live page were stored raw: each layer
        holds at most ``num_chunks // num_layers`` chunks of raw slots (exact with compression off)."""
        live = self.cfg.max_pages - len(self.free_ids)
        return (self.cfg.num_chunks // self.cfg.num_layers) * self.slots_per_chunk - live

    def reserve(self, request_id: str, max_new_pages: int) -> None:
        """Set the pages ``request_id`` may still allocate; raises OutOfPages if they do not fit."""
        if max_new_pages < 0:
            raise ValueError(f"max_new_pages must be >= 0, got {max_new_pages} for {request_id!r}")
        old = self.reservations.get(request_id, 0)
        total = self.reserved_pages - old + max_new_pages
        room = self.fits(total + self.held_margin_pages())
        if max_new_pages > old and (total > len(self.free_ids) or not room):
            raise OutOfPages(
                f"cannot reserve {max_new_pages} pages for {request_id!r}: {self.headroom_pages()} more fit "
                "after existing reservations; admit it later or with a shorter max length"
            )
        self.reservations[request_id] = max_new_pages
        self.reserved_pages += max_new_pages - old
        self._fit = None

    def release(self, request_id: str) -> None:
        self.reserved_pages -= self.reservations.pop(request_id, 0)
        self._fit = None

    # ---- pages -------------------------------------------------------------------------------------
    def allocate(
        self, n: int, request_ids: str | Sequence[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` new page ids at raw size in every layer -> (ids int64 [n], unit offsets int64 [L, n]).

        ``request_ids`` (one id, or one per page) draw on those requests' reservations first.
        """
        if n <= 0:
            return np.zeros(0, dtype=I64), np.zeros((self.cfg.num_layers, 0), dtype=I64)
        taken = self._reservation_draw(n, request_ids)
        drawn = sum(taken.values())
        if n + self.reserved_pages - drawn > len(self.free_ids):
            raise OutOfPages(
                f"{n} page ids asked, {len(self.free_ids)} left of max_pages {self.cfg.max_pages} "
                f"({self.reserved_pages - drawn} reserved by others); raise max_pages"
            )
        margin = self.held_margin_pages() if n > drawn else 0  # reserved pages may use the margin
        if not self.fits(self.reserved_pages - drawn + n + margin):
            raise OutOfPages(
                f"{n} new pages do not fit: {self.headroom_pages()} fit after {self.reserved_pages} reserved "
                f"(of which {drawn} are this request's); wait for running requests to finish"
            )
        short = -(-np.maximum(n - self.free_slots, 0) // self.slots_per_chunk)  # RAW chunks each layer takes
        if short.any():
            self._take_chunks(np.repeat(np.arange(self.cfg.num_layers, dtype=I64), short), ChunkKind.RAW)
        ids = np.array(self.free_ids[-n:][::-1], dtype=I64)
        del self.free_ids[-n:]
        units = self._pop_slots(n)
        chunks = units // self.cu
        np.add.at(self.chunk_live, chunks.ravel(), self.raw)
        self.page_unit[:, ids], self.page_units[:, ids], self.page_chunk[:, ids] = units, self.raw, chunks
        self.page_state[ids] = PageState.RAW
        for rid, k in taken.items():
            self.reservations[rid] -= k
        self.reserved_pages -= drawn
        self._fit = None
        return ids, units

    def _reservation_draw(self, n: int, request_ids: str | Sequence[str] | None) -> dict[str, int]:
        if request_ids is None:
            return {}
        if isinstance(request_ids, str):
            wants = {request_ids: n}
        else:
            if len(request_ids) != n:
                raise ValueError(f"{len(request_ids)} request ids given for {n} pages; give one per page")
            wants = {}
            for rid in request_ids:
                wants[rid] = wants.get(rid, 0) + 1
        return {rid: min(k, self.reservations.get(rid, 0)) for rid, k in wants.items()}

    def _checked_ids(self, page_ids: Sequence[int] | np.ndarray, allowed: tuple[int, ...]) -> np.ndarray:
        ids = unique_sorted(np.asarray(page_ids, dtype=I64).ravel())
        if ids.size and (ids[0] < 0 or ids[-1] >= self.cfg.max_pages):
            raise ValueError(f"page ids must lie in [0, {self.cfg.max_pages}), got {ids[0]}..{ids[-1]}")
        ok = np.zeros(len(PageState.NAMES), dtype=bool)
        ok[list(allowed)] = True
        bad = ids[~ok[self.page_state[ids]]]
        if bad.size:
            states = [PageState.NAMES[s] for s in self.page_state[bad[:5]]]
            raise ValueError(
                f"pages {bad[:5].tolist()} are {states}, expected {[PageState.NAMES[s] for s in allowed]}"
            )
        return ids

    def free(self, page_ids: Sequence[int] | np.ndarray) -> None:
        """Give pages back in every layer (they may be in any live state). Nothing changes on error."""
        live = (PageState.RAW, PageState.FULL, PageState.ENCODING, PageState.COMPRESSED)
        ids = self._checked_ids(page_ids, live)
        if ids.size == 0:
            return
        state = self.page_state[ids]
        raw_ids = ids[(state == PageState.RAW) | (state == PageState.FULL)]
        if raw_ids.size:
            self._free_slots(self.page_unit[:, raw_ids])
        # an encoding page still holds its raw slot (freed with its batch) and a worst-case log place
        chunks = self.page_chunk[:, ids]
        log = state >= PageState.ENCODING
        np.add.at(self.chunk_live, chunks[:, log].ravel(), -self.page_units[:, ids[log]].ravel())
        self.page_state[ids] = PageState.FREE
        self.page_gen[ids] += 1
        self.page_unit[:, ids], self.page_chunk[:, ids], self.page_units[:, ids] = -1, -1, 0
        self.free_ids.extend(ids[::-1].tolist())
        self._retire_empty(chunks.ravel())
        self._fit = None

    def _free_slots(self, units: np.ndarray) -> None:
        """Return raw slots ``units`` (int64 [L, k]) to their layers."""
        self._push_slots(units)
        np.add.at(self.chunk_live, (units // self.cu).ravel(), -self.raw)

    def mark_full(self, page_ids: Sequence[int] | np.ndarray) -> None:
        """Pages that filled: compressed in the next encode launch (if compression is on)."""
        ids = self._checked_ids(page_ids, (PageState.RAW, PageState.FULL))
        ids = ids[self.page_state[ids] == PageState.RAW]
        self.page_state[ids] = PageState.FULL
        if self.cfg.compression:
            self.full_queue.extend(ids.tolist())

    # ---- the encode pipeline and compaction: encode.py and compaction.py plan, the ledger applies ----
    def plan_encode(self) -> EncodePlan | None:
        """Take the queued full pages (as many as fit now) and give each a worst-case place per layer."""
        if not self.full_queue:
            return None
        queue = unique_sorted(np.asarray(self.full_queue, dtype=I64))
        queue = queue[self.page_state[queue] == PageState.FULL]
        k = encode.encodable(self, int(queue.size))
        self.full_queue = queue[k:].tolist()  # the rest waits for room (they stay valid raw pages)
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
        self, max_pages: int = 2048, max_layers: int = 1, live_fraction: float | None = None
    ) -> MovePlan | None:
        """Plan moves for at most ``max_pages`` (layer, page) pairs in at most ``max_layers`` layers (those
        with the most candidate chunks first); updates the host tables at once.

        The caller copies the bytes on the device and then calls ``moved`` so that the emptied chunks
        start draining behind the copy.
        """
        cands = compaction.candidates(self, live_fraction)
        if cands.size == 0:
            return None
        parts, budget = [], max_pages
        for layer in compaction.layer_order(self, cands, max_layers):
            move = compaction.plan_layer(
                self, layer, cands, self.page_chunk[layer], self.page_units[layer], self.page_state
            )
            if move is None:
                continue
            if move.pages.size > budget:
                break
            budget -= move.pages.size
            parts.append(self._apply_move(move))
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
