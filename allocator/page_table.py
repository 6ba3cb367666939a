"""The host mirror of the page table, over the chunks: each page id's state and place in every layer, and
what changes them from outside the encoder: allocation, freeing, pages that filled, reservations, and the
headroom those leave.

No torch here (units and numpy arrays, like chunks.py). ``Ledger`` (ledger.py) adds the encode pipeline and
compaction, which move pages; split from it because this side only hands out and takes back pages.
Every operation is vectorised over layers: a page id has a page in every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from zipkv.allocator.capacity import pages_fit
from zipkv.allocator.chunks import ChunkTable
from zipkv.allocator.plans import (
    ChunkKind,
    CompletedFence,
    Fence,
    LedgerConfig,
    OutOfPages,
    PageState,
    unique_sorted,
)

I64 = np.int64


class PageTable(ChunkTable):
    _fit: int | None

    def __init__(self, cfg: LedgerConfig, new_fence: Callable[[], Fence] = CompletedFence) -> None:
        super().__init__(cfg, new_fence)
        n_l, n_p = cfg.num_layers, cfg.max_pages
        self.page_state = np.zeros(n_p, dtype=np.int8)
        self.page_gen = np.zeros(n_p, dtype=I64)
        self.page_unit = np.full((n_l, n_p), -1, dtype=I64)
        self.page_units = np.zeros((n_l, n_p), dtype=I64)
        self.page_chunk = np.full((n_l, n_p), -1, dtype=I64)
        self.free_ids: list[int] = list(range(n_p - 1, -1, -1))
        self.full_queue: list[int] = []  # pages marked full, waiting for an encode launch (ledger.py)
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
            room = pages_fit(self.free_units(), self.raw, self.cu, len(self.pool), 0, self.cfg.shared_pool)
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
