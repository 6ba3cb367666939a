"""Capacity arithmetic: how many new pages fit in every layer (docs/design.md, the allocator's rule 4).

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


def _fits_many(
    free: np.ndarray, totals: np.ndarray, raw_page_units: int, chunk_units: int, pool_chunks: int
) -> np.ndarray:
    """``fits`` (with the pool) for many page counts at once: bool [len(totals)]."""
    deficit = np.maximum(totals[:, None] * raw_page_units - free[None, :], 0)
    return (-(-deficit // chunk_units)).sum(axis=1) <= pool_chunks


def _fluid_max(free: np.ndarray, budget_units: np.ndarray, raw_page_units: int) -> np.ndarray:
    """About the largest T with sum(max(0, T * raw - free)) <= budget, for each of ``budget_units``
    (int64 [b]): the need without rounding to chunks, inverted segment by segment over the sorted free
    space (an estimate: callers verify it). int64 [b]; 0 where the budget is negative."""
    s = np.sort(free)
    # with the k smallest layers short: t_k = (budget + their free units) // (k * raw); the first t_k
    # that does not make the next layer short too is the answer
    t = (budget_units[:, None] + np.cumsum(s)) // (np.arange(1, s.size + 1, dtype=np.int64) * raw_page_units)
    settled = np.ones(t.shape, dtype=bool)
    settled[:, :-1] = t[:, :-1] * raw_page_units <= s[1:]
    est = t[np.arange(t.shape[0]), np.argmax(settled, axis=1)]
    return np.where(budget_units < 0, 0, est)


def _spread(lo: int, hi: int, num: int) -> np.ndarray:
    """``num`` (>= 2) distinct integers from ``lo`` to ``hi``, evenly spread: what
    ``np.unique(np.linspace(lo, hi, num).round())`` gives, without its overhead. The step is 1 or more
    than 1 (``num <= hi - lo + 1``), so rounding never repeats a value."""
    y = np.arange(num, dtype=np.float64) * ((hi - lo) / (num - 1)) + lo
    y[-1] = hi
    return np.rint(y).astype(np.int64)


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
    # Bracket the answer with the fluid need f (every unit usable, no rounding to whole chunks): the chunk
    # need g satisfies f <= g < f + L, so the answer lies between the fluid answers for budgets of
    # (pool - L) and pool chunks, a chunk's worth of pages apart when every layer is short. Both ends are
    # verified (and widened to the safe bounds if an estimate is off); then 64 candidates are tested at once.
    top = int((free.sum() + pool_chunks * chunk_units) // (free.size * raw_page_units))  # nothing beyond
    budgets = np.array([pool_chunks - free.size, pool_chunks], dtype=np.int64) * chunk_units
    est_lo, est_hi = _fluid_max(free, budgets, raw_page_units).tolist()
    lo, hi = max(0, est_lo - 1), min(top, est_hi + 1)
    # the ends and the first 64 candidates in one evaluation (the candidates count if the ends hold)
    totals = _spread(lo, hi, min(64, hi - lo + 1)) if lo < hi else np.zeros(0, dtype=np.int64)
    ok = _fits_many(free, np.concatenate(([lo, hi + 1], totals)), raw_page_units, chunk_units, pool_chunks)
    first: tuple[np.ndarray, np.ndarray] | None = (totals, ok[2:])
    if not ok[0]:
        lo, first = 0, None
    if ok[1] or hi < lo:
        hi, first = top, None
    while lo < hi:
        if first is None:
            totals = _spread(lo, hi, min(64, hi - lo + 1))
            ok = _fits_many(free, totals, raw_page_units, chunk_units, pool_chunks)
        else:
            (totals, ok), first = first, None
        last = int(np.count_nonzero(ok)) - 1  # fitting is monotone: the candidates that fit come first
        if last == totals.size - 1:
            lo = int(totals[-1])
            break
        lo = int(totals[last]) if last >= 0 else lo
        hi = int(totals[last + 1]) - 1
    return max(0, lo - reserved_pages)
