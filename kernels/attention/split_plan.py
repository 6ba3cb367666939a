"""How a decode step's contexts are cut into splits, and the work list the decode kernels walk.

Pure torch on the KV device, no sync (the decode plan is recorded into SGLang's CUDA graph): static shapes,
and every choice is made by tensor ops on ``kv_lens``. decode_plan.py's docstring says why the splits are
balanced over the batch rather than counted per request.
"""

from __future__ import annotations

import torch

MIN_SPLIT_TILES = 2  # a split reads at least this many tiles, so its fixed cost stays small
SPLIT_LENGTH_STEPS = 8  # candidate split lengths per octave (a split at most 9% longer than balance needs)
SPLIT_LENGTH_OCTAVES = 20  # candidates from MIN_SPLIT_TILES up to 2^20 times that
LADDER_FRACTION_BITS = 40  # the ladder's fixed point (ladder_tiles)
WORK_FIELDS = 4  # a work item: (request or -1, first token, end token, the request's first page index)


def ladder_tiles(device: torch.device) -> torch.Tensor:
    """int64 [C]: the candidate split lengths in tiles, ``ceil(MIN_SPLIT_TILES * 2^(c / STEPS))``.

    In fixed point, so that every device and the plan's Triton kernel (split_plan_triton.py) get the same
    integers: float32 ``exp2`` rounds two of them (c = 146, 154) up by one, and a GPU's may differ from the
    CPU's. A mantissa off by one unit of 2^-LADDER_FRACTION_BITS moves no ceiling: the exact values stay at
    least 0.002 from an integer."""
    steps = torch.arange(SPLIT_LENGTH_STEPS * SPLIT_LENGTH_OCTAVES, device=device)
    fraction = (steps % SPLIT_LENGTH_STEPS).to(torch.float64) / SPLIT_LENGTH_STEPS
    mantissa = torch.floor(torch.exp2(fraction) * 2.0**LADDER_FRACTION_BITS).to(torch.int64) * MIN_SPLIT_TILES
    one = 1 << LADDER_FRACTION_BITS
    return (torch.bitwise_left_shift(mantissa, steps // SPLIT_LENGTH_STEPS) + one - 1) >> LADDER_FRACTION_BITS


def balanced_splits(tiles: torch.Tensor, pair_slots: int, max_splits: int) -> torch.Tensor:
    """int64 [B]: each request's split count for ``tiles`` (int64 [B], its context in tiles).

    One split length for the whole batch, the shortest on a geometric ladder (from MIN_SPLIT_TILES tiles)
    whose splits, at most ``max_splits`` and at least one per request, number ``pair_slots`` or fewer;
    when even one split each is too many, one split each."""
    ladder = ladder_tiles(tiles.device)  # [C]
    need = ((tiles[:, None] + ladder[None, :] - 1) // ladder[None, :]).clamp(1, max_splits).sum(0)  # [C]
    fits = (need <= pair_slots).to(torch.int32)
    first = torch.argmax(fits).view(1)  # the first (shortest) length that fits; 0 when none does
    # index_select, not a Python index: a 0-dim device index must not become a host sync in a CUDA graph
    length = torch.where(fits.index_select(0, first) > 0, ladder.index_select(0, first), tiles.max().view(1))
    return ((tiles + length - 1) // length).clamp(1, max_splits)


def even_split_tiles(tiles: torch.Tensor, splits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(splits, tiles per split), int64 [B]: ``splits`` evened out within each request, no empty split."""
    split_tiles = (tiles + splits - 1) // splits
    return (tiles + split_tiles - 1) // split_tiles, split_tiles


def work_items(
    splits: torch.Tensor,
    split_tokens: torch.Tensor,
    kv_lens: torch.Tensor,
    page_indptr: torch.Tensor,
    num_pairs: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(work int32 [num_pairs, WORK_FIELDS], pair_start int32 [B]): request b's splits are the work items
    pair_start[b] .. pair_start[b] + splits[b] - 1, in token order; items past the last split are idle
    (request -1). ``splits``/``split_tokens``: int64 [B]; ``kv_lens``, ``page_indptr``: int32 [B], [B + 1];
    ``num_pairs`` must be at least splits.sum() (the plan's static bound)."""
    batch = splits.numel()
    cum = torch.cumsum(splits, 0)
    start = cum - splits
    pair = torch.arange(num_pairs, device=splits.device, dtype=torch.int64)
    req = torch.searchsorted(cum, pair, right=True)  # batch for pairs past the last split
    live = req < batch
    r = req.clamp(max=batch - 1)
    first = (pair - start[r]) * split_tokens[r]
    end = torch.minimum(kv_lens[r].to(torch.int64), first + split_tokens[r])
    work = torch.stack([torch.where(live, r, -1), first, end, page_indptr[r].to(torch.int64)], 1)
    return work.to(torch.int32), start.to(torch.int32)


def program_items(
    kv_lens: torch.Tensor, page_indptr: torch.Tensor, block_n: int, programs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's tiles shared out evenly over ``programs`` programs per KV head (a program may take the
    end of one request and the start of the next): (splits int64 [B], split_tiles int64 [B], work int32
    [programs + B, WORK_FIELDS], pair_start int32 [B], program_items int32 [programs + 1]); program p runs
    work items ``program_items[p] .. program_items[p + 1] - 1`` in turn.

    Why: every program of one launch resident at once, each with the same tiles, so no SM runs out of work
    before the others. Whole waves of equal splits cannot do that when the programs a wave holds are not a
    multiple of the batch (59 requests x 8 KV heads = 472 programs on an H200's 528 slots: 76 SMs run four
    and 56 three, and a program's speed barely depends on how many share its SM, docs/benchmarks.md).

    The tiles of the batch, request after request, are cut every ``share = ceil(total / programs)`` tiles:
    program p owns tiles ``p * share .. (p + 1) * share - 1``, and a work item is one request's part of one
    program's share (the request's splits are its items, consecutive, as work_items lays them out; the
    merge reads them the same way). ``split_tiles`` holds each request's longest split."""
    batch = kv_lens.numel()
    tiles = (kv_lens.to(torch.int64) + block_n - 1) // block_n
    ends = torch.cumsum(tiles, 0)
    starts = ends - tiles
    share = (ends[-1:] + programs - 1) // programs  # [1]: tiles per program
    first_prog = starts // share
    splits = (ends - 1) // share - first_prog + 1
    cum = torch.cumsum(splits, 0)
    pair_start = cum - splits
    pair = torch.arange(programs + batch, device=kv_lens.device, dtype=torch.int64)
    req = torch.searchsorted(cum, pair, right=True)
    live = req < batch
    r = req.clamp(max=batch - 1)
    prog = first_prog[r] + pair - pair_start[r]  # the program whose share holds this item
    lo = torch.maximum(starts[r], prog * share) - starts[r]
    hi = torch.minimum(ends[r], (prog + 1) * share) - starts[r]
    first, end = lo * block_n, torch.minimum(kv_lens[r].to(torch.int64), hi * block_n)
    work = torch.stack([r, first, end, page_indptr[r].to(torch.int64)], 1)
    work = torch.where(live[:, None], work, torch.tensor([-1, 0, 0, 0], device=work.device))  # idle items
    # program p's first item: the one holding tile p * share (past the last tile: none, the item count)
    tile = torch.arange(programs + 1, device=kv_lens.device, dtype=torch.int64) * share
    holder = torch.searchsorted(ends, tile, right=True)
    h = holder.clamp(max=batch - 1)
    prog_first = torch.where(holder < batch, pair_start[h] + tile // share - first_prog[h], cum[-1:])
    split_tiles = torch.minimum(tiles, share)  # a request's longest item is at most one share
    return splits, split_tiles, work.to(torch.int32), pair_start.to(torch.int32), prog_first.to(torch.int32)
