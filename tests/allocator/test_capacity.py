"""Capacity arithmetic: the seed's worked example, and agreement with a brute-force search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zipkv.allocator.capacity import fits, pages_fit

CHUNKS_PER_LAYER, CHUNK_UNITS, NEW_PAGE_UNITS = 10, 10, 4
EXISTING_PAGES, COMPRESSED_UNITS = 20, (1, 3)  # layer 0 compresses to 1 unit a page, layer 1 to 3


def _example_state(shared_pool: bool) -> tuple[list[int], int]:
    """(free units per layer, empty chunks in the pool) of the example, built from its description."""
    used = [EXISTING_PAGES * size for size in COMPRESSED_UNITS]  # packed: 20 and 60 units
    full_chunks = [math.ceil(u / CHUNK_UNITS) for u in used]
    if not shared_pool:  # each layer keeps its 10 chunks
        return [CHUNKS_PER_LAYER * CHUNK_UNITS - u for u in used], 0
    # fully empty chunks go back to the pool; what is left in a layer is the tail of its last chunk
    tails = [c * CHUNK_UNITS - u for c, u in zip(full_chunks, used, strict=True)]
    return tails, sum(CHUNKS_PER_LAYER - c for c in full_chunks)


def test_seed_worked_example_without_pool_fits_10() -> None:
    free, pool = _example_state(shared_pool=False)
    assert free == [80, 40]
    assert pages_fit(free, NEW_PAGE_UNITS, CHUNK_UNITS, pool, shared_pool=False) == 10


def test_seed_worked_example_with_pool_fits_15() -> None:
    free, pool = _example_state(shared_pool=True)
    assert (free, pool) == ([0, 0], 12)
    assert pages_fit(free, NEW_PAGE_UNITS, CHUNK_UNITS, pool, shared_pool=True) == 15
    # 15 pages take 6 chunks in each layer; a 16th would need 7 + 7 > 12
    assert not fits(np.array(free), 16, NEW_PAGE_UNITS, CHUNK_UNITS, pool, True)


def test_seed_worked_example_compressed_sizing_would_admit_80_and_is_refused() -> None:
    free, _ = _example_state(shared_pool=False)
    # sizing a new page at layer 0's compressed size (1 unit) claims 80 pages fit there ...
    naive = pages_fit(free[:1], COMPRESSED_UNITS[0], CHUNK_UNITS, 0, shared_pool=False)
    assert naive == 80
    # ... but 80 pages being written need 80 x 4 = 320 units in layer 0 (80 free) and layer 1 (40 free)
    assert not fits(np.array(free), naive, NEW_PAGE_UNITS, CHUNK_UNITS, 0, False)
    assert not fits(np.array(free[:1]), naive, NEW_PAGE_UNITS, CHUNK_UNITS, 0, False)
    for shared_pool in (False, True):
        free_s, pool = _example_state(shared_pool)
        assert pages_fit(free_s, NEW_PAGE_UNITS, CHUNK_UNITS, pool, shared_pool=shared_pool) < naive


@pytest.mark.parametrize(
    ("free", "pool", "reserved", "shared", "want"),
    [
        ([80, 40], 0, 0, False, 10),
        ([80, 40], 0, 4, False, 6),
        ([80, 40], 0, 11, False, 0),  # over-reserved: never negative
        ([0, 0], 12, 0, True, 15),
        ([0, 0], 12, 5, True, 10),
        ([3, 3], 0, 0, True, 0),  # tails smaller than a page
        ([4, 0], 1, 0, True, 1),  # layer 1 takes a pool chunk (2 pages' worth, chunk-rounded)
        ([8, 0], 1, 0, True, 2),
        ([12, 0], 1, 0, True, 2),  # layer 1 is the tightest: one chunk holds 2 pages of 4 units
    ],
)
def test_pages_fit_table(free: list[int], pool: int, reserved: int, shared: bool, want: int) -> None:
    assert pages_fit(free, NEW_PAGE_UNITS, CHUNK_UNITS, pool, reserved, shared) == want


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        pages_fit([1], 0, 10)
    with pytest.raises(ValueError, match="non-empty"):
        pages_fit([], 4, 10)
    with pytest.raises(ValueError, match=">= 0"):
        pages_fit([1], 4, 10, pool_chunks=-1)


def _brute_force(free: list[int], raw: int, chunk: int, pool: int, shared: bool) -> int:
    best = 0
    for n in range(1, 200):
        if shared:
            need = sum(max(0, -(-(n * raw - f) // chunk)) for f in free)
            ok = need <= pool
        else:
            ok = all(f >= n * raw for f in free)
        if ok:
            best = n
    return best


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    raw=st.integers(1, 6),
    per_chunk=st.integers(1, 4),
    pool=st.integers(0, 8),
    shared=st.booleans(),
)
def test_pages_fit_matches_brute_force(
    free: list[int], raw: int, per_chunk: int, pool: int, shared: bool
) -> None:
    chunk = raw * per_chunk
    assert pages_fit(free, raw, chunk, pool if shared else 0, 0, shared) == _brute_force(
        free, raw, chunk, pool if shared else 0, shared
    )


@settings(max_examples=200, deadline=None)
@given(
    slots=st.lists(st.integers(0, 200), min_size=1, max_size=32),
    per_chunk=st.sampled_from([1, 2, 8, 32]),
    pool=st.integers(0, 3000),
)
def test_pages_fit_is_the_largest_that_fits(slots: list[int], per_chunk: int, pool: int) -> None:
    """Pool-sized cases (up to 32 layers, thousands of chunks): the answer fits and one more does not."""
    raw = 256
    free = np.array(slots, dtype=np.int64) * raw
    n = pages_fit(free, raw, raw * per_chunk, pool, 0, True)
    assert fits(free, n, raw, raw * per_chunk, pool, True)
    assert not fits(free, n + 1, raw, raw * per_chunk, pool, True)
