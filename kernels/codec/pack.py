"""The pool's pack: encoded pages moved from their stage places to their packed places, kept units only.

The page pool (allocator/pool.py) encodes a step's full pages into worst-case stage places (a raw page's
room each) and then packs each region's pages one after another once their sizes are known on the device.
A page's packed place can overlap an earlier page's stage place, so a slice of pages is copied out before
any of it is written back. The torch way (allocator/pack.py) gathers every staged page whole and scatters
all of its units, the dropped ones to a scratch unit. This kernel copies the kept units only, in two
launches: stage -> ``temp`` (the slice's kept units one page after another), then ``temp`` -> packed place.
Same bytes in the same places (tests/allocator/test_pack.py). Which way a pool uses: allocator/pack.py
``pack_choice`` (this kernel on CUDA, where the GPU measured it faster).

Units are rows of 8-byte words (int64 ``[units, words]``): 8 words for page format v3 (64-byte units),
32 for v1/v2 (256-byte units).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_UNITS = 64  # units a program copies (v3: 4 KiB, a sixteenth of a raw page)


@triton.jit
def _copy_units_kernel(
    src_ptr, dst_ptr, src_first_ptr, dst_first_ptr, size_ptr,
    WORDS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Copy units [0, size) of page ``program_id(0)`` from src_first + j to dst_first + j (unit indices into
    int64 [units, WORDS] tensors), BLOCK units per program along ``program_id(1)``."""
    page = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    size = tl.load(size_ptr + page)
    live = j < size
    w = tl.arange(0, WORDS)
    src = (tl.load(src_first_ptr + page) + j).to(tl.int64)
    dst = (tl.load(dst_first_ptr + page) + j).to(tl.int64)
    vals = tl.load(src_ptr + src[:, None] * WORDS + w[None, :], mask=live[:, None])
    tl.store(dst_ptr + dst[:, None] * WORDS + w[None, :], vals, mask=live[:, None])


def pack_units(
    units: torch.Tensor,
    temp: torch.Tensor,
    stage: torch.Tensor,
    dst: torch.Tensor,
    size_units: torch.Tensor,
    raw_page_units: int,
) -> None:
    """Move a slice of pages: units [0, size_units[i]) of page i from ``stage[i]`` to ``dst[i]`` (int64 [k]
    unit indices into ``units``, int64 [N, W]). ``temp`` (int64 [>= k * raw_page_units, W]) holds the kept
    units between the two launches, so no write lands on a stage place before it is read. No host sync."""
    k, words = stage.numel(), units.shape[1]
    if k == 0:
        return
    if temp.shape[1] != words or temp.shape[0] < k * raw_page_units:
        raise ValueError(f"temp must be int64 [>= {k * raw_page_units}, {words}], got {list(temp.shape)}")
    at = torch.cumsum(size_units, 0) - size_units  # each page's kept units in temp, one after another
    grid = (k, triton.cdiv(raw_page_units, BLOCK_UNITS))
    _copy_units_kernel[grid](units, temp, stage, at, size_units, WORDS=words, BLOCK=BLOCK_UNITS)
    _copy_units_kernel[grid](temp, units, at, dst, size_units, WORDS=words, BLOCK=BLOCK_UNITS)
