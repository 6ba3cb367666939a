"""The even-shares plan (split_plan.program_items) in one Triton program, as split_plan_triton.py is for the
balanced splits: the torch version is some 40 small kernels a step, this one launch. It gives the torch
version's integers exactly (tests/kernels/test_split_plan.py compares them); the torch version stays the
reference and the CPU path.

Two passes over the batch: the total tiles (so the share), then each request's items (one per program
whose share it meets), their work rows and each program's first item; then the programs past the last
tile, which get none.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .split_plan import WORK_FIELDS

CHUNK_REQUESTS = 128  # requests a loop step handles: one a thread of the 4 warps


@triton.jit
def _request_tiles(kv_lens_ptr, b0, batch, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """(live, kv_len, tiles) of requests b0 .. b0 + CHUNK - 1, int64; 0 tiles past the batch."""
    rows = b0 + tl.arange(0, CHUNK)
    live = rows < batch
    kv = tl.load(kv_lens_ptr + rows, mask=live, other=0).to(tl.int64)
    return live, kv, (kv + BLOCK_N - 1) // BLOCK_N


@triton.jit
def _store_items(work_ptr, prog_items_ptr, req, kv, tiles, page0, start, first_prog, splits, tile0, share, k,
                 live, BLOCK_N: tl.constexpr, FIELDS: tl.constexpr):  # fmt: skip
    """Item ``k`` of each request: its work row, and the program's first item if it opens the share."""
    mine = live & (k < splits)
    prog = first_prog + k
    lo = tl.maximum(tile0, prog * share) - tile0
    hi = tl.minimum(tile0 + tiles, (prog + 1) * share) - tile0
    item = start + k
    row = work_ptr + item * FIELDS
    tl.store(row, req.to(tl.int32), mask=mine)
    tl.store(row + 1, (lo * BLOCK_N).to(tl.int32), mask=mine)
    tl.store(row + 2, tl.minimum(kv, hi * BLOCK_N).to(tl.int32), mask=mine)
    tl.store(row + 3, page0, mask=mine)
    opens = (k > 0) | (tile0 == first_prog * share)  # the item holds its program's first tile
    tl.store(prog_items_ptr + prog, item.to(tl.int32), mask=mine & opens)


# Not specialised on the batch's numbers: one compile serves every CUDA-graph batch size SGLang captures.
@triton.jit(do_not_specialize=["batch", "programs"])
def _even_shares_kernel(
    kv_lens_ptr, indptr_ptr, splits_ptr, split_tokens_ptr, work_ptr, pair_start_ptr, prog_items_ptr,
    batch, programs, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, FIELDS: tl.constexpr,
):  # fmt: skip
    zero = tl.sum(tl.zeros([CHUNK], tl.int64), 0)
    total_tiles = zero
    for b0 in range(0, batch, CHUNK):
        total_tiles += tl.sum(_request_tiles(kv_lens_ptr, b0, batch, BLOCK_N, CHUNK)[2], 0)
    share = (total_tiles + programs - 1) // programs
    tiles_before = zero
    items = zero
    for b0 in range(0, batch, CHUNK):
        live, kv, tiles = _request_tiles(kv_lens_ptr, b0, batch, BLOCK_N, CHUNK)
        tile0 = tiles_before + tl.cumsum(tiles, 0) - tiles
        first_prog = tile0 // share
        splits = tl.where(live, (tile0 + tiles - 1) // share - first_prog + 1, 0)
        start = items + tl.cumsum(splits, 0) - splits
        tiles_before += tl.sum(tiles, 0)
        items += tl.sum(splits, 0)
        req = b0 + tl.arange(0, CHUNK)
        tl.store(splits_ptr + req, splits.to(tl.int32), mask=live)
        tl.store(split_tokens_ptr + req, (tl.minimum(tiles, share) * BLOCK_N).to(tl.int32), mask=live)
        tl.store(pair_start_ptr + req, start.to(tl.int32), mask=live)
        page0 = tl.load(indptr_ptr + req, mask=live, other=0)
        for k in range(0, tl.max(splits, 0)):
            _store_items(work_ptr, prog_items_ptr, req, kv, tiles, page0, start, first_prog, splits, tile0,
                         share, k, live, BLOCK_N, FIELDS)  # fmt: skip
    _idle(work_ptr, prog_items_ptr, items, total_tiles, share, batch, programs, CHUNK, FIELDS)


@triton.jit
def _idle(work_ptr, prog_items_ptr, items, total_tiles, share, batch, programs, CHUNK: tl.constexpr,
          FIELDS: tl.constexpr):  # fmt: skip
    """Items past the last (request -1, zeros) and programs past the last tile (no item: the count)."""
    offs = tl.arange(0, CHUNK)
    for p0 in range(items, programs + batch, CHUNK):
        p = p0 + offs
        row = work_ptr + p * FIELDS
        idle = p < programs + batch
        tl.store(row, tl.full([CHUNK], -1, tl.int32), mask=idle)
        for f in range(1, FIELDS):
            tl.store(row + f, tl.zeros([CHUNK], tl.int32), mask=idle)
    for p0 in range(0, programs + 1, CHUNK):
        p = p0 + offs
        tl.store(prog_items_ptr + p, items.to(tl.int32) + tl.zeros([CHUNK], tl.int32),
                 mask=(p <= programs) & (p * share >= total_tiles))  # fmt: skip


def even_shares_triton(
    kv_lens: torch.Tensor, page_indptr: torch.Tensor, block_n: int, programs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(splits, split_tokens, work, pair_start, program_items), int32: split_plan.program_items' result
    (split_tiles as tokens) in one launch. ``kv_lens`` int32 [B] (each >= 1), ``page_indptr`` int32
    [B + 1], on one device."""
    batch, device = kv_lens.numel(), kv_lens.device
    splits = torch.empty(batch, dtype=torch.int32, device=device)
    split_tokens = torch.empty(batch, dtype=torch.int32, device=device)
    pair_start = torch.empty(batch, dtype=torch.int32, device=device)
    work = torch.empty(programs + batch, WORK_FIELDS, dtype=torch.int32, device=device)
    prog_items = torch.empty(programs + 1, dtype=torch.int32, device=device)
    _even_shares_kernel[(1,)](
        kv_lens, page_indptr, splits, split_tokens, work, pair_start, prog_items, batch, programs,
        BLOCK_N=block_n, CHUNK=CHUNK_REQUESTS, FIELDS=WORK_FIELDS, num_warps=4,
    )  # fmt: skip
    return splits, split_tokens, work, pair_start, prog_items
