"""Tile loads and restore of the fused decode kernel for page format v2 (low bytes in code-byte pairs).

In v2 (kernels/format/layout.py) a compressed row stores the low bytes of channels ``k`` and ``k + D/2`` next
to each other, so one 16-bit load per channel pair serves every row: a compressed row's two low bytes, or a
raw row's bf16 value of channel ``k``. A raw row adds one 16-bit load for channel ``k + D/2``; a compressed
row adds its code byte. Per channel pair that is 5 bytes of registers instead of v1's 7 (two low bytes, a
code byte and two bf16 values), so more programs fit per SM. The restored tiles are the same bits as
v1's, and the twin (raw pages) is unchanged. The default format since the H200 measured it 1-3.5% faster
than v1 (docs/benchmarks.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _bf16_boundary, restore_program

# Four channel pairs per call (decode_tiles.restore_program). $4/$5: the 16-bit words of channels k..k+3
# (compressed rows: bytes lo(k), lo(k + D/2), lo(k+1), lo(k+1 + D/2), ...; raw rows: bf16 of channels
# k..k+3); $6/$7: bf16 of channels k + D/2 .. (raw rows only); $8: code bytes; $9: the markers. prmt picks
# each low byte out of the pair words; raw rows select the pair words themselves for the first half.
# Outputs: $0/$1 channels k..k+3, $2/$3 channels k + D/2 ...
_RESTORE_PAIRED_PTX = tl.constexpr(
    restore_program(
        "$8",
        "$9",
        (("$4", "0x5240"), ("$5", "0x7260"), ("$4", "0x5341"), ("$5", "0x7361")),
        ("$4", "$5", "$6", "$7"),
    )
)


@triton.jit
def _restore_paired(pair, raw_b, code, marker, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr):
    """Both bf16 [N, D/2] halves from the pair words (bf16-typed [N, D/2]), raw rows' second half (bf16
    [N, D/2]), codes (uint8 [N, D/2]) and per-row markers (uint8 [N, 1])."""
    if USE_ASM:
        out_a, out_b = tl.inline_asm_elementwise(
            _RESTORE_PAIRED_PTX,
            "=r,=r,=r,=r,r,r,r,r,r,r",
            [pair, raw_b, code, marker],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=False,  # the dots must see a 16-bit origin, as in the twin (decode_tiles._bf16_boundary)
            pack=4,
        )
    else:
        w = pair.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        c = code.to(tl.int32)
        hb = marker.to(tl.int32) & 0x7F
        high_a = ((c & 0x07) + hb) | (c & 0x80)
        high_b = (((c >> 3) & 0x07) + hb) | ((c << 1) & 0x80)
        bits_a = (high_a << 8) | (w & 0xFF)
        bits_b = (high_b << 8) | (w >> 8)
        is_raw = marker == 0xFF
        out_a = tl.where(is_raw, pair, bits_a.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_b = tl.where(is_raw, raw_b, bits_b.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_a = _bf16_boundary(out_a, INTERPRET)
        out_b = _bf16_boundary(out_b, INTERPRET)
    return out_a, out_b


@triton.jit
def _tile_loads_paired(
    heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM: tl.constexpr, ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """Issue a v2 tile's loads: one 16-bit word per channel pair for every row, codes of compressed rows,
    the second bf16 half of raw rows. Rows past the context read as raw rows whose V is zero-filled."""
    HALF: tl.constexpr = HEAD_DIM // 2
    ch = tl.arange(0, HALF)[None, :]
    t = (tok % 16) % (512 // HEAD_DIM)  # token row inside its block
    is_raw = marker == 0xFF
    comp = (valid & ~is_raw)[:, None]
    raw = (valid & is_raw)[:, None]
    low_elem = tl.multiple_of((start + t * HEAD_DIM) // 2, 32)
    raw_elem = tl.multiple_of((start + t * (2 * HEAD_DIM)) // 2, 64)
    pair_row = tl.multiple_of(tl.where(is_raw, raw_elem, low_elem), 32)[:, None]
    code_row = tl.multiple_of(start + 512 + t * HALF, 32)[:, None]
    raw_row = raw_elem[:, None]
    code = tl.load(heap_u8 + code_row + ch, mask=comp)
    if ZERO_FILL:
        pair = tl.load(heap_bf16 + pair_row + ch, mask=valid[:, None], other=0.0)
        raw_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=raw, other=0.0)
    else:
        pair = tl.load(heap_bf16 + pair_row + ch, mask=valid[:, None])
        raw_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=raw)
    return pair, raw_b, code


@triton.jit
def _load_tile_paired(
    heap_u8, heap_bf16, start, marker, tok, valid,
    HEAD_DIM: tl.constexpr, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr, ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """The two bf16 [N, D/2] halves of a v2 K or V tile, restored in registers where compressed."""
    pair, raw_b, code = _tile_loads_paired(heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM, ZERO_FILL)
    return _restore_paired(pair, raw_b, code, marker.to(tl.uint8)[:, None], USE_ASM, INTERPRET)
