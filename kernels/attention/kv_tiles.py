"""A tile's K and V rows for the page format a kernel is compiled for: the one place the decode and extend
kernels dispatch on it (v1: attention/tiles.py, v2: attention/tiles_paired.py, v3: attention/tiles_v3.py).

Every path hands back the same two bf16 ``[BLOCK_N, D/2]`` halves per K and V (channels ``p`` and
``p + D/2``), so everything after the loads, `_attend_tile` included, is one code for every format and for
the uncompressed twin, which reads every page as a plain raw page whatever the version.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _kv_row_starts, _load_tile
from .tiles_paired import _load_tile_paired
from .tiles_v3 import _kv_row_starts_v3, _load_tile_v3, _patch_gaps


@triton.jit
def _kv_rows(
    tok, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, COMPRESSED: tl.constexpr, V3: tl.constexpr,
):  # fmt: skip
    """Where a tile's K and V rows live: (k_start, k_marker, v_start, v_marker). v1/v2: each row's block
    offset and marker (decode_tiles._row_starts); v3: each row's record or raw row and its metadata row."""
    if V3 and COMPRESSED:
        k_start, k_marker, v_start, v_marker = _kv_row_starts_v3(
            tok, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr.to(tl.pointer_type(tl.uint8)), head,
            NUM_KV_HEADS, HEAD_DIM,
        )  # fmt: skip
    else:
        k_start, k_marker, v_start, v_marker = _kv_row_starts(
            tok, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
        )  # fmt: skip
    return k_start, k_marker, v_start, v_marker


@triton.jit
def _load_kv_tiles(
    heap_u8, heap_bf16, meta32_ptr, k_start, k_marker, v_start, v_marker, tok, valid, head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, COMPRESSED: tl.constexpr, USE_ASM: tl.constexpr,
    INTERPRET: tl.constexpr, PAIRED: tl.constexpr, V3: tl.constexpr,
):  # fmt: skip
    """A K tile and a V tile (each as two bf16 [N, D/2] halves) of the rows `_kv_rows` found: v3, v2 pairs
    (PAIRED) or v1 rows when compressed, raw rows in the twin. V rows past the context read as zeros."""
    if V3 and COMPRESSED:
        meta_u8 = meta32_ptr.to(tl.pointer_type(tl.uint8))
        k_gap, v_gap = _patch_gaps(head, NUM_KV_HEADS, HEAD_DIM)
        k_a, k_b = _load_tile_v3(
            heap_u8,
            heap_bf16,
            meta_u8,
            k_start,
            k_marker,
            tok,
            valid,
            k_gap,
            HEAD_DIM,
            USE_ASM,
            INTERPRET,
            False,
        )
        v_a, v_b = _load_tile_v3(
            heap_u8,
            heap_bf16,
            meta_u8,
            v_start,
            v_marker,
            tok,
            valid,
            v_gap,
            HEAD_DIM,
            USE_ASM,
            INTERPRET,
            True,
        )
    elif PAIRED and COMPRESSED:
        k_a, k_b = _load_tile_paired(
            heap_u8, heap_bf16, k_start, k_marker, tok, valid, HEAD_DIM, USE_ASM, INTERPRET, False
        )
        v_a, v_b = _load_tile_paired(
            heap_u8, heap_bf16, v_start, v_marker, tok, valid, HEAD_DIM, USE_ASM, INTERPRET, True
        )
    else:
        k_a, k_b = _load_tile(
            heap_u8, heap_bf16, k_start, k_marker, tok, valid, HEAD_DIM, COMPRESSED, USE_ASM, INTERPRET, False
        )
        v_a, v_b = _load_tile(
            heap_u8, heap_bf16, v_start, v_marker, tok, valid, HEAD_DIM, COMPRESSED, USE_ASM, INTERPRET, True
        )
    return k_a, k_b, v_a, v_b
