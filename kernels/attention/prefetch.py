"""Register double-buffering for the fused decode kernel (``prefetch``), every page format version.

The next tile's loads are issued before this tile is restored and attended, so they are in flight during
the compute; row addresses run two tiles ahead (page table -> page location -> metadata is a chain of
dependent loads). One loop serves v1, v2 and v3: `_loads` and `_restore_tile` dispatch on the version, and
a tile's loads travel as five tensors per K or V (v1: low bytes a/b, codes, raw bf16 a/b; v2 has three and
repeats its pair words in the other two, which nothing reads; v3: pair words, raw second halves, codes,
metadata bytes, patch bytes). Measured slower than the plain loop for the default shape on v2
(docs/benchmarks.md); kept for the shapes where it fits without spills.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kv_tiles import _kv_rows
from .tiles import _attend_tile, _restore, _tile_loads
from .tiles_paired import _restore_paired, _tile_loads_paired
from .tiles_v3 import _patch_gaps, _restore_v3, _tile_loads_v3


@triton.jit
def _loads(heap_u8, heap_bf16, meta_u8, start, marker, tok, valid, patch_gap, HEAD_DIM: tl.constexpr,
           ZERO_FILL: tl.constexpr, PAIRED: tl.constexpr, V3: tl.constexpr):  # fmt: skip
    """One K or V (ZERO_FILL: rows past the context read as zeros) tile's loads as five tensors."""
    if V3:
        t0, t1, t2, t3, t4 = _tile_loads_v3(
            heap_u8, heap_bf16, meta_u8, start, marker, tok, valid, patch_gap, HEAD_DIM, ZERO_FILL
        )
    elif PAIRED:
        t0, t1, t2 = _tile_loads_paired(heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM, ZERO_FILL)
        t3 = t0
        t4 = t0
    else:
        t0, t1, t2, t3, t4 = _tile_loads(heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM, ZERO_FILL)
    return t0, t1, t2, t3, t4


@triton.jit
def _restore_tile(t0, t1, t2, t3, t4, marker, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr,
                  PAIRED: tl.constexpr, V3: tl.constexpr):  # fmt: skip
    """Both bf16 halves of a tile from `_loads`' five tensors and its rows' markers (v1/v2; v3 carries its
    per-value metadata bytes in the loads)."""
    if V3:
        out_a, out_b = _restore_v3(t0, t1, t2, t3, t4, USE_ASM, INTERPRET)
    elif PAIRED:
        out_a, out_b = _restore_paired(t0, t1, t2, marker.to(tl.uint8)[:, None], USE_ASM, INTERPRET)
    else:
        out_a, out_b = _restore(t0, t1, t2, marker.to(tl.uint8)[:, None], t3, t4, USE_ASM, INTERPRET)
    return out_a, out_b


@triton.jit
def _attend_prefetched(
    q_a, q_b, m_i, l_i, acc_a, acc_b, qk_scale, first, end, page_base, head,
    k_start, k_marker, v_start, v_marker, heap_u8, heap_bf16, page_ids_ptr, page_loc_ptr, meta32_ptr,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr,
    PAIRED: tl.constexpr, V3: tl.constexpr,
):  # fmt: skip
    """Online softmax over tokens ``first .. end`` of compressed pages with the loads one tile ahead;
    returns (m_i, l_i, acc_a, acc_b). ``k_start .. v_marker``: the first tile's rows (`_kv_rows`)."""
    meta_u8 = meta32_ptr.to(tl.pointer_type(tl.uint8))
    k_gap, v_gap = _patch_gaps(head, NUM_KV_HEADS, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    tok = first + offs_n
    k0, k1, k2, k3, k4 = _loads(
        heap_u8, heap_bf16, meta_u8, k_start, k_marker, tok, tok < end, k_gap, HEAD_DIM, False, PAIRED, V3
    )
    v0, v1, v2, v3, v4 = _loads(
        heap_u8, heap_bf16, meta_u8, v_start, v_marker, tok, tok < end, v_gap, HEAD_DIM, True, PAIRED, V3
    )
    k_mark = k_marker
    v_mark = v_marker
    k_start, k_marker, v_start, v_marker = _kv_rows(
        tok + BLOCK_N, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
        NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, True, V3,
    )  # fmt: skip
    for tile in range(first, end, BLOCK_N):
        tok = tile + offs_n
        valid = tok < end
        c_k0, c_k1, c_k2, c_k3, c_k4, c_k_mark = k0, k1, k2, k3, k4, k_mark
        c_v0, c_v1, c_v2, c_v3, c_v4, c_v_mark = v0, v1, v2, v3, v4, v_mark
        nxt = tok + BLOCK_N
        k0, k1, k2, k3, k4 = _loads(
            heap_u8, heap_bf16, meta_u8, k_start, k_marker, nxt, nxt < end, k_gap, HEAD_DIM, False, PAIRED, V3
        )
        v0, v1, v2, v3, v4 = _loads(
            heap_u8, heap_bf16, meta_u8, v_start, v_marker, nxt, nxt < end, v_gap, HEAD_DIM, True, PAIRED, V3
        )
        k_mark = k_marker
        v_mark = v_marker
        k_start, k_marker, v_start, v_marker = _kv_rows(
            nxt + BLOCK_N, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, True, V3,
        )  # fmt: skip
        k_a, k_b = _restore_tile(c_k0, c_k1, c_k2, c_k3, c_k4, c_k_mark, USE_ASM, INTERPRET, PAIRED, V3)
        v_a, v_b = _restore_tile(c_v0, c_v1, c_v2, c_v3, c_v4, c_v_mark, USE_ASM, INTERPRET, PAIRED, V3)
        m_i, l_i, acc_a, acc_b = _attend_tile(
            q_a, q_b, k_a, k_b, v_a, v_b, valid[None, :], m_i, l_i, acc_a, acc_b, qk_scale, INTERPRET
        )
    return m_i, l_i, acc_a, acc_b
