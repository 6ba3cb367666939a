"""The decode step's split plan in one Triton program: split_plan.py's torch ops, fused.

The torch version is 67 small kernels a step (ladder, clamps, cumsum, searchsorted, gathers, casts): replayed
in a CUDA graph on an H100 they take 87-114 us, this one launch 8-22 us, and SGLang's decode step at batch 8
fell from 7.07 to 6.92 ms with it (docs/benchmarks.md, "The split plan in one launch"). One program is
enough: the step's metadata is a few hundred integers. It gives the torch version's integers exactly
(tests/kernels/test_split_plan.py compares them); the torch version stays the reference and the CPU path.

Three phases, as split_plan.py: the shortest ladder length whose splits fit ``num_pairs`` work items (a
binary search: 8 sums over the batch where the torch version sums all 160 lengths), each request's even
splits with a running cumsum, each request's splits scattered to its work items; then the idle items.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .split_plan import (
    LADDER_FRACTION_BITS,
    MIN_SPLIT_TILES,
    SPLIT_LENGTH_OCTAVES,
    SPLIT_LENGTH_STEPS,
    WORK_FIELDS,
)

CHUNK_REQUESTS = 128  # requests (or idle items) a loop step handles: one a thread of the 4 warps
NUM_LENGTHS = SPLIT_LENGTH_STEPS * SPLIT_LENGTH_OCTAVES  # the ladder's candidate split lengths
SEARCH_STEPS = NUM_LENGTHS.bit_length()  # a binary search over NUM_LENGTHS + 1 outcomes


@triton.jit
def _ladder(c, MIN_TILES: tl.constexpr, STEPS: tl.constexpr, FRACTION_BITS: tl.constexpr):
    """split_plan.ladder_tiles in fixed point: floor(2^(j/8) * 2^40) for the step j within an octave."""
    j = c % STEPS
    mantissa = tl.where(j == 0, 1099511627776, tl.where(j == 1, 1199025932245, tl.where(
        j == 2, 1307547050779, tl.where(j == 3, 1425890169698, tl.where(j == 4, 1554944255987, tl.where(
            j == 5, 1695678735018, tl.where(j == 6, 1849150772653, 2016513216442)))))))  # fmt: skip
    scaled = (mantissa.to(tl.int64) * MIN_TILES) << (c // STEPS).to(tl.int64)
    return (scaled + ((1 << FRACTION_BITS) - 1)) >> FRACTION_BITS


@triton.jit
def _split_count(tiles, length, max_splits):
    """split_plan.balanced_splits' count for a context of ``tiles``: splits of ``length``, 1..max_splits."""
    return tl.minimum(tl.maximum((tiles + length - 1) // length, 1), max_splits)


@triton.jit
def _even_splits(tiles, length, max_splits):
    """(splits, tiles per split): the count evened out, no empty split (split_plan.even_split_tiles)."""
    count = _split_count(tiles, length, max_splits)
    split_tiles = (tiles + count - 1) // count
    return (tiles + split_tiles - 1) // split_tiles, split_tiles


@triton.jit
def _splits_needed(kv_lens_ptr, batch, length, max_splits, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """Work items the batch takes when its splits are ``length`` tiles long (each request 1..max_splits)."""
    rows = tl.arange(0, CHUNK)
    need = tl.sum(tl.zeros([CHUNK], tl.int64), 0)
    for b0 in range(0, batch, CHUNK):
        live = b0 + rows < batch
        tiles = (tl.load(kv_lens_ptr + b0 + rows, mask=live, other=0).to(tl.int64) + BLOCK_N - 1) // BLOCK_N
        need += tl.sum(tl.where(live, _split_count(tiles, length, max_splits), 0), 0)
    return need


# Not specialised on the batch's numbers: one compile serves every CUDA-graph batch size SGLang captures.
@triton.jit(do_not_specialize=["batch", "num_pairs", "max_splits"])
def _split_plan_kernel(
    kv_lens_ptr, indptr_ptr, splits_ptr, split_tokens_ptr, work_ptr, pair_start_ptr,
    batch, num_pairs, max_splits,
    BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, NUM_LENGTHS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    MIN_TILES: tl.constexpr, STEPS: tl.constexpr, FRACTION_BITS: tl.constexpr, FIELDS: tl.constexpr,
):  # fmt: skip
    # The first ladder length whose splits fit: the items needed only fall as the length grows, so a
    # binary search over the NUM_LENGTHS candidates (NUM_LENGTHS: none fits) needs SEARCH_STEPS sums.
    lo = tl.program_id(0) * 0
    hi = lo + NUM_LENGTHS
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        fits = (lo < hi) & (_splits_needed(kv_lens_ptr, batch, _ladder(mid, MIN_TILES, STEPS, FRACTION_BITS),
                                           max_splits, BLOCK_N, CHUNK) <= num_pairs)  # fmt: skip
        hi = tl.where(fits, mid, hi)
        lo = tl.where(fits | (lo >= hi), lo, mid + 1)
    rows = tl.arange(0, CHUNK)
    most_tiles = tl.sum(tl.zeros([CHUNK], tl.int64), 0)
    for b0 in range(0, batch, CHUNK):
        kv = tl.load(kv_lens_ptr + b0 + rows, mask=b0 + rows < batch, other=0).to(tl.int64)
        most_tiles = tl.maximum(most_tiles, tl.max((kv + BLOCK_N - 1) // BLOCK_N, 0))
    length = tl.where(lo < NUM_LENGTHS, _ladder(lo, MIN_TILES, STEPS, FRACTION_BITS), most_tiles)

    total = tl.sum(tl.zeros([CHUNK], tl.int64), 0)
    for b0 in range(0, batch, CHUNK):  # each request's even splits, and where its items start
        live = b0 + rows < batch
        kv = tl.load(kv_lens_ptr + b0 + rows, mask=live, other=1).to(tl.int64)
        splits, split_tiles = _even_splits((kv + BLOCK_N - 1) // BLOCK_N, length, max_splits)
        splits = tl.where(live, splits, 0)
        start = total + tl.cumsum(splits, 0) - splits
        total += tl.sum(splits, 0)
        tl.store(splits_ptr + b0 + rows, splits.to(tl.int32), mask=live)
        tl.store(split_tokens_ptr + b0 + rows, (split_tiles * BLOCK_N).to(tl.int32), mask=live)
        tl.store(pair_start_ptr + b0 + rows, start.to(tl.int32), mask=live)
        page0 = tl.load(indptr_ptr + b0 + rows, mask=live, other=0)
        for j in range(0, max_splits):  # the request's splits: items start .. start + splits - 1
            mine = live & (j < splits)
            first_token = j * split_tiles * BLOCK_N
            end_token = tl.minimum(kv, first_token + split_tiles * BLOCK_N)
            item = work_ptr + (start + j) * FIELDS
            tl.store(item, (b0 + rows).to(tl.int32), mask=mine)
            tl.store(item + 1, first_token.to(tl.int32), mask=mine)
            tl.store(item + 2, end_token.to(tl.int32), mask=mine)
            tl.store(item + 3, page0, mask=mine)
    _idle_items(kv_lens_ptr, indptr_ptr, work_ptr, batch, num_pairs, total.to(tl.int32), length, max_splits,
                BLOCK_N, CHUNK, FIELDS)  # fmt: skip


@triton.jit
def _idle_items(
    kv_lens_ptr, indptr_ptr, work_ptr, batch, num_pairs, total, length, max_splits,
    BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, FIELDS: tl.constexpr,
):  # fmt: skip
    """Items past the last split: request -1, and the other fields as split_plan.work_items gives them
    (the last request's numbers carried on), so the two plans are equal integer for integer."""
    kv = tl.load(kv_lens_ptr + batch - 1).to(tl.int64)
    splits, split_tiles = _even_splits((kv + BLOCK_N - 1) // BLOCK_N, length, max_splits)
    start = total - splits
    page0 = tl.load(indptr_ptr + batch - 1)
    offs = tl.arange(0, CHUNK)
    for p0 in range(total, num_pairs, CHUNK):
        p = p0 + offs
        idle = p < num_pairs
        first_token = (p - start) * split_tiles * BLOCK_N
        item = work_ptr + p * FIELDS
        tl.store(item, tl.full([CHUNK], -1, tl.int32), mask=idle)
        tl.store(item + 1, first_token.to(tl.int32), mask=idle)
        tl.store(item + 2, tl.minimum(kv, first_token + split_tiles * BLOCK_N).to(tl.int32), mask=idle)
        tl.store(item + 3, tl.zeros([CHUNK], tl.int32) + page0, mask=idle)


def split_work_triton(
    kv_lens: torch.Tensor, page_indptr: torch.Tensor, block_n: int, num_pairs: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(splits, split_tokens, work, pair_start), int32: decode_plan._split_work's result in one launch.
    ``kv_lens`` int32 [B] (each >= 1), ``page_indptr`` int32 [B + 1], on one device; ``num_pairs`` at least
    the batch (plan_shape.pair_slots)."""
    batch, device = kv_lens.numel(), kv_lens.device
    splits = torch.empty(batch, dtype=torch.int32, device=device)
    split_tokens = torch.empty(batch, dtype=torch.int32, device=device)
    pair_start = torch.empty(batch, dtype=torch.int32, device=device)
    work = torch.empty(num_pairs, WORK_FIELDS, dtype=torch.int32, device=device)
    _split_plan_kernel[(1,)](
        kv_lens, page_indptr, splits, split_tokens, work, pair_start, batch, num_pairs, max_splits,
        BLOCK_N=block_n, CHUNK=CHUNK_REQUESTS, NUM_LENGTHS=NUM_LENGTHS, SEARCH_STEPS=SEARCH_STEPS,
        MIN_TILES=MIN_SPLIT_TILES, STEPS=SPLIT_LENGTH_STEPS, FRACTION_BITS=LADDER_FRACTION_BITS,
        FIELDS=WORK_FIELDS, num_warps=4,
    )  # fmt: skip
    return splits, split_tokens, work, pair_start
