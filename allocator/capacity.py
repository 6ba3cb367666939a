"""Capacity arithmetic: how many new pages fit in every layer (DESIGN.md section 5, rule 4).

Pure integer arithmetic over *units* (any unit: the pool uses 256-byte units, the seed's worked example
uses its own). Every new page costs ``raw_page_units`` in every layer (rule 1: new pages are allocated
at uncompressed size, whatever they will compress to later). A layer first uses its own free space;
what it lacks comes from the shared pool in whole chunks (rule 3), so capacity is set by the tightest
layer without the pool and by the total with it.

The seed's example: two layers of 10 chunks of 10 units, new pages of 4 units; layer 0 has 80 units free,
layer 1 has 40. Without the pool ``min(80, 40) // 4 = 10`` pages fit; with the pool (the 12 empty chunks
are in it) ``15`` fit: 6 chunks for each layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(raw_page_units: int, chunk_units: int, pool_chunks: int, reserved_pages: int) -> None:
    if raw_page_units <= 0 or chunk_units <= 0:
        raise ValueError(f"raw_page_units ({raw_page_units}) and chunk_units ({chunk_units}) must be > 0")
    if pool_chunks < 0 or reserved_pages < 0:
        raise ValueError(f"pool_chunks ({pool_chunks}) and reserved_pages ({reserved_pages}) must be >= 0")


def pool_chunks_needed(
    free_units: np.ndarray, total_pages: int, raw_page_units: int, chunk_units: int
) -> int:
    """Chunks the shared pool must hand out so that every layer holds ``total_pages`` more new pages."""
    deficit = np.maximum(total_pages * raw_page_units - free_units, 0)
    return int((-(-deficit // chunk_units)).sum())


def fits(
    free_units: np.ndarray,
    total_pages: int,
    raw_page_units: int,
    chunk_units: int,
    pool_chunks: int,
    shared_pool: bool,
) -> bool:
    """Whether ``total_pages`` new pages (reservations included) fit in every layer."""
    if total_pages <= 0:
        return True
    if not shared_pool:
        return bool(free_units.min() >= total_pages * raw_page_units)
    return pool_chunks_needed(free_units, total_pages, raw_page_units, chunk_units) <= pool_chunks


def pages_fit(
    free_units: Sequence[int] | np.ndarray,
    raw_page_units: int,
    chunk_units: int,
    pool_chunks: int = 0,
    reserved_pages: int = 0,
    shared_pool: bool = True,
) -> int:
    """Most new pages that fit in every layer after ``reserved_pages`` (never negative).

    ``free_units[l]``: units layer ``l`` can place new pages in without the pool (its free slots, and in
    a pool-less setup its empty chunks). ``pool_chunks``: empty chunks in the shared pool.
    """
    _check(raw_page_units, chunk_units, pool_chunks, reserved_pages)
    free = np.asarray(free_units, dtype=np.int64)
    if free.ndim != 1 or free.size == 0:
        raise ValueError(f"free_units must be a non-empty 1-D sequence, got shape {free.shape}")
    if not shared_pool:
        return max(0, int(free.min() // raw_page_units) - reserved_pages)
    # The fluid bound (every unit usable by any layer) is an upper bound; the need in whole pool chunks is
    # monotone in the page count, so a binary search between 0 and that bound finds the exact answer.
    hi = int((free.sum() + pool_chunks * chunk_units) // (free.size * raw_page_units))
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(free, mid, raw_page_units, chunk_units, pool_chunks, True):
            lo = mid
        else:
            hi = mid - 1
    return max(0, lo - reserved_pages)
