"""Host-side bookkeeping of the page pool: chunks, slots, page table mirror, reservations.

No torch here: everything is in units (``plans.UNIT_BYTES``) and numpy arrays, so it can be driven and
checked without a device (tests, the admission simulation, the bookkeeping benchmark). ``PagePool``
(pool.py) wraps it, owns the device tensors and carries out its plans.

Memory is ``num_chunks`` chunks. A chunk is empty (in the shared pool, or held by one layer when there is
no pool), a RAW chunk of fixed slots for uncompressed pages, or a LOG chunk where compressed pages sit one
after another behind a bump pointer. Every per-step operation is vectorised over layers: a page id has a
page in every layer, so allocating, freeing and compressing touch all layers at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from zipkv.allocator import capacity, compaction, encode
from zipkv.allocator.plans import (
    ChunkKind,
    CompletedFence,
    EncodeBatch,
    EncodePlan,
    Fence,
    MovePlan,
    OutOfPages,
    PageState,
    unique_sorted,
)

I64 = np.int64


@dataclass(frozen=True)
class LedgerConfig:
    num_layers: int
    num_chunks: int
    chunk_units: int
    raw_page_units: int
    max_pages: int
    shared_pool: bool = True
    compression: bool = True
    compaction_live_fraction: float = 0.5  # LOG chunks less live than this get their pages moved out

    def __post_init__(self) -> None:
        if min(self.num_layers, self.chunk_units, self.raw_page_units, self.max_pages) < 1:
            raise ValueError(f"{self}: layers, chunk/page sizes and max_pages must all be >= 1")
        if self.chunk_units % self.raw_page_units != 0:
            raise ValueError(
                f"a chunk ({self.chunk_units} units) must hold whole raw pages ({self.raw_page_units} units);"
                " pick chunk_bytes as a multiple of the format's raw_page_bytes"
            )
        if self.num_chunks < self.num_layers:
            raise ValueError(
                f"{self.num_chunks} chunks cannot give each of {self.num_layers} layers one; "
                "raise budget_bytes or lower chunk_bytes"
            )
        if not 0.0 <= self.compaction_live_fraction < 1.0:
            raise ValueError(f"compaction_live_fraction {self.compaction_live_fraction} not in [0, 1)")


class Ledger:
    def __init__(self, cfg: LedgerConfig, new_fence: Callable[[], Fence] = CompletedFence) -> None:
        self.cfg, self.new_fence = cfg, new_fence
        n_l, n_c, n_p = cfg.num_layers, cfg.num_chunks, cfg.max_pages
        self.raw, self.cu = cfg.raw_page_units, cfg.chunk_units
        self.slots_per_chunk = self.cu // self.raw
        self.chunk_owner = np.full(n_c, -1, dtype=I64)
        self.chunk_kind = np.zeros(n_c, dtype=np.int8)
        self.chunk_live = np.zeros(n_c, dtype=I64)  # units of live pages (worst case while encoding)
        self.chunk_bump = np.zeros(n_c, dtype=I64)  # LOG: units handed out from the chunk's start
        self.chunk_pending = np.zeros(n_c, dtype=I64)  # LOG: encode regions whose sizes are not back
        self.slots: list[list[int]] = [[] for _ in range(n_l)]  # free raw slots (unit offsets), a stack
        self.free_slots = np.zeros(n_l, dtype=I64)
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
        self.batches: deque[EncodeBatch] = deque()
        self.page_state = np.zeros(n_p, dtype=np.int8)
        self.page_gen = np.zeros(n_p, dtype=I64)
        self.page_unit = np.full((n_l, n_p), -1, dtype=I64)
        self.page_units = np.zeros((n_l, n_p), dtype=I64)
        self.page_chunk = np.full((n_l, n_p), -1, dtype=I64)
        self.free_ids: list[int] = list(range(n_p - 1, -1, -1))
        self.full_queue: list[int] = []
        self.reservations: dict[str, int] = {}
        self.reserved_pages = 0
        # Room kept out of what new pages and reservations may take, so that an encode launch can always
        # place its worst case and compression never stalls: one chunk in every layer.
        self.encode_margin_pages = self.slots_per_chunk if cfg.compression else 0
        self._fit: int | None = None

    # ---- capacity ----------------------------------------------------------------------------------
    def free_units(self) -> np.ndarray:
        """Units each layer can put new pages in without the pool."""
        units = self.free_slots * self.raw
        if not self.cfg.shared_pool:
            units = units + np.array([len(e) for e in self.private_empty], dtype=I64) * self.cu
        return units

    def _fits(self, total_pages: int, free_units: np.ndarray | None = None, pool: int | None = None) -> bool:
        return capacity.fits(
            self.free_units() if free_units is None else free_units,
            total_pages,
            self.raw,
            self.cu,
            len(self.pool) if pool is None else pool,
            self.cfg.shared_pool,
        )

    def new_pages_fit(self) -> int:
        """New pages that fit in every layer after the reservations; never optimistic."""
        if self._fit is None:
            ids_left = max(0, len(self.free_ids) - self.reserved_pages)
            held = self.reserved_pages + self.encode_margin_pages
            self._fit = min(
                ids_left,
                capacity.pages_fit(
                    self.free_units(),
                    self.raw,
                    self.cu,
                    len(self.pool),
                    held,
                    self.cfg.shared_pool,
                ),
            )
        return self._fit

    def reserve(self, request_id: str, max_new_pages: int) -> None:
        """Set the pages ``request_id`` may still allocate; raises OutOfPages if they do not fit."""
        if max_new_pages < 0:
            raise ValueError(f"max_new_pages must be >= 0, got {max_new_pages} for {request_id!r}")
        old = self.reservations.get(request_id, 0)
        total = self.reserved_pages - old + max_new_pages
        room = self._fits(total + self.encode_margin_pages)
        if max_new_pages > old and (total > len(self.free_ids) or not room):
            raise OutOfPages(
                f"cannot reserve {max_new_pages} pages for {request_id!r}: {self.new_pages_fit()} more fit "
                "after existing reservations; admit it later or with a shorter max length"
            )
        self.reservations[request_id] = max_new_pages
        self.reserved_pages += max_new_pages - old
        self._fit = None

    def release(self, request_id: str) -> None:
        self.reserved_pages -= self.reservations.pop(request_id, 0)
        self._fit = None

    # ---- chunks ------------------------------------------------------------------------------------
    def _take_chunk(self, layer: int, kind: int) -> int:
        source = self.pool if self.cfg.shared_pool else self.private_empty[layer]
        if not source:  # callers check capacity first, so this is a bookkeeping bug
            raise OutOfPages(f"layer {layer} needs a chunk and none is free (internal: capacity was checked)")
        c = source.pop()
        self.chunk_owner[c], self.chunk_kind[c], self.chunk_bump[c] = layer, kind, 0
        if kind == ChunkKind.RAW:
            base = c * self.cu
            self.slots[layer].extend(range(base + self.cu - self.raw, base - 1, -self.raw))
            self.free_slots[layer] += self.slots_per_chunk
        return c

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
            if not self._fits(self.reserved_pages, free_units=self.free_units() - lost):
                self.idle_raw.update(empty[raw].tolist())
                empty, owners, raw = empty[~raw], owners[~raw], raw[~raw]
                if empty.size == 0:
                    return
            else:
                self.idle_raw.difference_update(empty[raw].tolist())
        cu = self.cu
        for layer in np.unique(owners[raw]).tolist():
            dead = empty[raw & (owners == layer)].tolist()
            if len(dead) == 1:  # the common case: compare with the chunk's bounds
                lo, hi = dead[0] * cu, dead[0] * cu + cu
                self.slots[layer] = [s for s in self.slots[layer] if s < lo or s >= hi]
            else:
                gone = set(dead)
                self.slots[layer] = [s for s in self.slots[layer] if s // cu not in gone]
            self.free_slots[layer] -= self.slots_per_chunk * len(dead)
        listed = empty[~raw & self.in_rooms[empty]]
        for c, layer in zip(listed.tolist(), self.chunk_owner[listed].tolist(), strict=True):
            self.log_rooms[layer].remove(c)
        self.in_rooms[listed] = False
        self.chunk_kind[empty] = ChunkKind.DRAINING
        self.draining.append((self.new_fence(), empty))
        self._fit = None

    def room_pages(self, c: int) -> int:
        """Worst-case (raw-size) pages that still fit behind LOG chunk ``c``'s bump pointer."""
        return int(self.cu - self.chunk_bump[c]) // self.raw

    def log_target(self, layer: int) -> int:
        """The LOG chunk the layer places its next compressed page in (taking a chunk if none has room)."""
        rooms = self.log_rooms[layer]
        while rooms and self.room_pages(rooms[-1]) == 0:
            self.in_rooms[rooms.pop()] = False
        if not rooms:
            c = self._take_chunk(layer, ChunkKind.LOG)
            rooms.append(c)
            self.in_rooms[c] = True
        return rooms[-1]

    def offer_room(self, chunks: np.ndarray) -> None:
        """LOG chunks whose bump pointer moved back: their tails take pages again."""
        back = (self.chunk_kind[chunks] == ChunkKind.LOG) & (self.cu - self.chunk_bump[chunks] >= self.raw)
        chunks = chunks[back & ~self.in_rooms[chunks]]
        for c, layer in zip(chunks.tolist(), self.chunk_owner[chunks].tolist(), strict=True):
            self.log_rooms[layer].insert(0, c)  # under the chunk being filled: used once it is full
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
        margin = self.encode_margin_pages if n > drawn else 0  # reserved pages may use the margin
        if not self._fits(self.reserved_pages - drawn + n + margin):
            raise OutOfPages(
                f"{n} new pages do not fit: {self.new_pages_fit()} fit after {self.reserved_pages} reserved "
                f"(of which {drawn} are this request's); wait for running requests to finish"
            )
        for layer in np.flatnonzero(self.free_slots < n).tolist():
            for _ in range(-(-(n - int(self.free_slots[layer])) // self.slots_per_chunk)):
                self._take_chunk(layer, ChunkKind.RAW)
        ids = np.array(self.free_ids[-n:][::-1], dtype=I64)
        del self.free_ids[-n:]
        units = np.empty((self.cfg.num_layers, n), dtype=I64)
        for layer, stack in enumerate(self.slots):
            units[layer] = stack[: -n - 1 : -1]
            del stack[-n:]
        self.free_slots -= n
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
        for layer, stack in enumerate(self.slots):
            stack.extend(units[layer].tolist())
        self.free_slots += units.shape[1]
        np.add.at(self.chunk_live, (units // self.cu).ravel(), -self.raw)

    def mark_full(self, page_ids: Sequence[int] | np.ndarray) -> None:
        """Pages that filled: compressed in the next encode launch (if compression is on)."""
        ids = self._checked_ids(page_ids, (PageState.RAW, PageState.FULL))
        ids = ids[self.page_state[ids] == PageState.RAW]
        self.page_state[ids] = PageState.FULL
        if self.cfg.compression:
            self.full_queue.extend(ids.tolist())

    # ---- the encode pipeline and compaction (encode.py, compaction.py) ----------------------------
    def plan_encode(self) -> EncodePlan | None:
        return encode.plan_encode(self)

    def launched(self, plan: EncodePlan, fence: Fence, read_sizes: Callable[[], np.ndarray]) -> None:
        encode.launched(self, plan, fence, read_sizes)

    def poll(self) -> None:
        """Apply encode batches and release draining chunks whose fences are done (never blocks)."""
        encode.poll(self)

    def plan_compaction(self, max_pages: int = 2048, max_layers: int = 1) -> MovePlan | None:
        return compaction.plan_compaction(self, max_pages, max_layers)

    def moved(self, plan: MovePlan) -> None:
        compaction.moved(self, plan)
