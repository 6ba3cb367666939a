"""Triton kernels that read the heap: restore raw or compressed pages to bf16 (kernels/format/layout.py).

The read side of the codec, split from the page writer (codec/encode.py) because the two share no kernel
code; zipkv.kernels.codec.pages holds the checked wrapper. One program per page-head by default, or per group
of page-heads (their offsets are in the metadata; on the H200 the grouping, warps and interleave change the
time by under 3%, see docs/benchmarks.md). Compressed blocks are restored a 32-bit word at a time
(docs/design.md): four high bytes from one code word with a mask, one add of ``b/2`` in every byte and an
OR of the signs, then high and low bytes are interleaved into bf16 pairs (PTX ``prmt`` on the GPU; shifts and
masks under the interpreter, which cannot run inline assembly). Integer-only: nothing here does bf16 math.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..format.layout import PAGE_TOKENS

_TOKENS = tl.constexpr(PAGE_TOKENS)  # globals reach a jitted function only as constexpr


@triton.jit
def _interleave(lo, hi, USE_PRMT: tl.constexpr):
    """uint32 low-byte and high-byte words -> two words of bf16 pairs (bytes l0 h0 l1 h1, l2 h2 l3 h3)."""
    if USE_PRMT:
        a = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x5140;", "=r,r,r", [lo, hi], dtype=tl.uint32, is_pure=True, pack=1
        )
        b = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x7362;", "=r,r,r", [lo, hi], dtype=tl.uint32, is_pure=True, pack=1
        )
    else:
        l0 = lo & 0xFFFF
        l0 = (l0 | (l0 << 8)) & 0x00FF00FF
        h0 = hi & 0xFFFF
        h0 = (h0 | (h0 << 8)) & 0x00FF00FF
        l1 = lo >> 16
        l1 = (l1 | (l1 << 8)) & 0x00FF00FF
        h1 = hi >> 16
        h1 = (h1 | (h1 << 8)) & 0x00FF00FF
        a = l0 | (h0 << 8)
        b = l1 | (h1 << 8)
    return a, b


@triton.jit
def _unpair(p0, p1, USE_PRMT: tl.constexpr):
    """Two v2 pair words (bytes lo(k), lo(k+H), lo(k+1), lo(k+1+H) and the next two pairs) -> the low-byte
    words of channels k..k+3 and of k+H..k+3+H, as v1 stores them."""
    if USE_PRMT:
        a = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x6420;", "=r,r,r", [p0, p1], dtype=tl.uint32, is_pure=True, pack=1
        )
        b = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x7531;", "=r,r,r", [p0, p1], dtype=tl.uint32, is_pure=True, pack=1
        )
    else:
        a = (p0 & 0xFF) | ((p0 >> 8) & 0xFF00) | ((p1 & 0xFF) << 16) | ((p1 << 8) & 0xFF000000)
        b = ((p0 >> 8) & 0xFF) | ((p0 >> 16) & 0xFF00) | ((p1 << 8) & 0xFF0000) | (p1 & 0xFF000000)
    return a, b


@triton.jit
def _decode_page_heads(
    heap_w, page, row0, meta_u8, meta_i32, out_w,
    D: tl.constexpr, R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, META_BYTES: tl.constexpr,
    G: tl.constexpr, USE_PRMT: tl.constexpr, STREAM: tl.constexpr, PAIRED: tl.constexpr,
):  # fmt: skip
    """Restore G page-heads (metadata rows ``row0 ..``, all K or all V) of the page at byte ``page``."""
    ROWS: tl.constexpr = G * NB * R  # tile rows: block rows of all G page-heads, in order
    Q: tl.constexpr = C // 8  # code words per block row; also low-byte words per half row
    g = tl.arange(0, G)
    rel = tl.load(meta_i32 + (row0 + g) * (META_BYTES // 4)).to(tl.int64)  # [G]
    markers = tl.load(meta_u8 + (row0 + g)[:, None] * META_BYTES + 4 + tl.arange(0, NB)[None, :]).to(
        tl.uint32
    )
    size = tl.where(markers == 255, 1024, 768)
    start = page + rel[:, None] + tl.cumsum(size, axis=1) - size  # [G, NB] bytes
    start_blk = tl.reshape(start, [G * NB])
    start_row = tl.multiple_of(tl.reshape(tl.broadcast_to(start_blk[:, None], [G * NB, R]), [ROWS]) // 4, 64)
    hb_blk = tl.reshape(markers, [G * NB])
    hb_row = tl.reshape(tl.broadcast_to(hb_blk[:, None], [G * NB, R]), [ROWS])
    rows = tl.arange(0, ROWS)
    rin = rows % R
    j = (rows // R) % NB
    token = (j // (D // C)) * R + rin
    out_row = (row0 + rows // (NB * R)).to(tl.int64) * (_TOKENS * D // 2) + (
        token * D + (j % (D // C)) * C
    ) // 2
    out_row = tl.multiple_of(out_row, C // 2)
    comp = (hb_row != 255)[:, None]
    raw = (hb_row == 255)[:, None]

    m = tl.arange(0, Q)
    row_w = start_row[:, None] + rin[:, None] * (C // 4)
    cw = tl.load(heap_w + start_row[:, None] + 128 + rin[:, None] * Q + m[None, :], mask=comp, other=0)
    if PAIRED:  # format v2: pair words (lo(k), lo(k + C/2), lo(k+1), lo(k+1 + C/2)): split them apart
        pw = tl.load(heap_w + row_w + tl.arange(0, 2 * Q)[None, :], mask=comp, other=0)
        p0, p1 = tl.split(tl.reshape(pw.to(tl.uint32, bitcast=True), [ROWS, Q, 2]))
        lw1, lw2 = _unpair(p0, p1, USE_PRMT)
    else:
        lw1 = tl.load(heap_w + row_w + m[None, :], mask=comp, other=0)
        lw2 = tl.load(heap_w + row_w + Q + m[None, :], mask=comp, other=0)
    w = tl.arange(0, 2 * Q)  # C/4 words: half a block row of bf16
    raw_w = start_row[:, None] + rin[:, None] * (C // 2) + w[None, :]
    raw1 = tl.load(heap_w + raw_w, mask=raw, other=0)
    raw2 = tl.load(heap_w + raw_w + 2 * Q, mask=raw, other=0)

    cw = cw.to(tl.uint32, bitcast=True)
    hb4 = hb_row[:, None] * 0x01010101
    # Values (t, k) sit in bits 0-2 (d) and 7 (sign) of each code byte, values (t, k + C/2) in 3-5 and 6.
    hi1 = ((cw & 0x07070707) + hb4) | (cw & 0x80808080)
    hi2 = (((cw >> 3) & 0x07070707) + hb4) | ((cw << 1) & 0x80808080)
    a0, a1 = _interleave(lw1.to(tl.uint32, bitcast=True), hi1, USE_PRMT)
    b0, b1 = _interleave(lw2.to(tl.uint32, bitcast=True), hi2, USE_PRMT)
    first = tl.where(raw, raw1, tl.reshape(tl.join(a0, a1), [ROWS, 2 * Q]).to(tl.int32, bitcast=True))
    second = tl.where(raw, raw2, tl.reshape(tl.join(b0, b1), [ROWS, 2 * Q]).to(tl.int32, bitcast=True))
    if STREAM:  # the restored pages are read once, by someone else: do not keep them in L2
        tl.store(out_w + out_row[:, None] + w[None, :], first, cache_modifier=".cs")
        tl.store(out_w + out_row[:, None] + 2 * Q + w[None, :], second, cache_modifier=".cs")
    else:
        tl.store(out_w + out_row[:, None] + w[None, :], first)
        tl.store(out_w + out_row[:, None] + 2 * Q + w[None, :], second)


@triton.jit
def _decode_pages_kernel(
    heap_w, offsets, meta_u8, meta_i32, out_w, H,
    D: tl.constexpr, KR: tl.constexpr, KC: tl.constexpr, VR: tl.constexpr, VC: tl.constexpr,
    NB: tl.constexpr, META_BYTES: tl.constexpr, G: tl.constexpr, USE_PRMT: tl.constexpr,
    STREAM: tl.constexpr, PAIRED: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    ph0 = tl.program_id(1) * G  # G divides H: a program's page-heads are all K or all V
    row0 = i * 2 * H + ph0
    page = tl.load(offsets + i)
    # A constexpr test first: with one geometry for K and V, only one copy of the restore is compiled.
    if KR == VR:  # noqa: SIM114
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, KR, KC, NB, META_BYTES, G, USE_PRMT, STREAM,
            PAIRED,
        )  # fmt: skip
    elif ph0 < H:
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, KR, KC, NB, META_BYTES, G, USE_PRMT, STREAM,
            PAIRED,
        )  # fmt: skip
    else:
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, VR, VC, NB, META_BYTES, G, USE_PRMT, STREAM,
            PAIRED,
        )  # fmt: skip
