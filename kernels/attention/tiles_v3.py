"""Tile loads and restore of the portable decode and extend kernels for page format v3
(kernels/format/layout_v3.py).

The kernels consume a K or V tile as two bf16 ``[BLOCK_N, D/2]`` halves (channels ``p`` and ``p + D/2``),
and v3 pairs exactly those channels, so only the loads change. Per token row, its page decides:

- page stored raw (metadata 0xFF, every new or tail page): plain ``[2, H, 16, D]`` bf16, loaded directly;
- coded page: the row's lo-plane word per pair (``lo(t, p) | lo(t, p + D/2) << 8``, one 16-bit load, at the
  place a raw row holds bf16 of channel ``p``), its code byte, and per value the metadata byte of its
  block (4 pairs share one): ``b/2`` of a coded block, restored as in v1/v2, or ``0x80 | r`` of a raw
  block, whose high bytes are the code byte (channel ``p``) and byte ``(t, p)`` of the page's patch ``r``
  (channel ``p + D/2``).

Rows past the context (and rows of raw pages) read no metadata and take the raw path; V there is loaded
as zeros, so p @ V stays finite whatever the page holds past its length. Nothing is decompressed to device
memory and no full-size copy is made. Page locations must be multiples of 16 bytes (v3 page sizes are
multiples of 64).

Restore: under the interpreter plain integers per value; on the GPU a PTX program restores four values
per 32-bit register (``restore_program_v3``, checked against the integer path by tests/kernels/
test_restore_ptx.py's emulator).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..format import layout_v3 as v3
from .tiles import _bf16_boundary

# The loads below compute layout_v3's byte order inline; a change there must fail here, not read wrong bytes.
_WANT = [16 * 64 + 64 * (p // 4) + 4 * t + p % 4 for t in range(16) for p in range(32)]
_FORMAT_OK = [v3.code_byte_index(t, p, 64) for t in range(16) for p in range(32)] == _WANT
_FORMAT_OK &= (v3.RAW_PAGE_MARKER, v3.RAW_BLOCK_FLAG, v3.page_head_bytes(64)) == (0xFF, 0x80, 24 * 64)
if not _FORMAT_OK:
    raise ImportError("the v3 decode tiles hard-code layout_v3's code byte order, markers and record size")


def restore_program_v3() -> str:
    """The PTX that restores four pairs (eight values) per call.

    Operands (``tl.inline_asm_elementwise``, pack=4): $4/$5 the 16-bit pair words of pairs p..p+3 (coded
    rows: lo(p) | lo(p + D/2) << 8; raw pages: bf16 of channel p), $6/$7 bf16 of channels p + D/2 .. (raw
    pages only), $8 code bytes, $9 each value's metadata byte, $10 patch bytes (raw blocks only). Outputs:
    $0/$1 channels p..p+3, $2/$3 channels p + D/2 ...

    high = (d + b/2) | sign, four bytes at once as in v1/v2 (no carries between bytes: each byte stays
    below 0x100). A metadata byte with its top bit set (raw block, or raw page) selects the code byte and
    the patch byte as the high bytes instead (prmt's sign-replicate mode makes the byte mask); a byte of
    0xFF (raw page: the low 7 bits all set, +1 reaches 0x80, and the top bit set) makes a 16-bit mask per
    value that selects the raw pair words.
    """
    lines = [
        "{",
        ".reg .b32 t, u, h, hb, rb, f, m0, m1;",
        "prmt.b32 rb, $9, 0, 0xBA98;",  # 0xFF in each byte whose marker is a raw block or a raw page
        "and.b32 hb, $9, 0x7F7F7F7F;",
        "add.u32 f, hb, 0x01010101;",
        "lop3.b32 f, f, $9, 0x80808080, 0x80;",  # 0x80 in each byte whose marker is 0xFF
        "prmt.b32 m0, f, 0, 0x9988;",
        "prmt.b32 m1, f, 0, 0xBBAA;",
        # channels p: d in bits 0-2, sign in bit 7; a raw block's code byte is the whole high byte
        "and.b32 t, $8, 0x07070707;",
        "add.u32 t, t, hb;",
        "lop3.b32 h, t, $8, 0x80808080, 0xF8;",
        "lop3.b32 h, h, $8, rb, 0xD8;",
        "prmt.b32 $0, $4, h, 0x5240;",
        "prmt.b32 $1, $5, h, 0x7260;",
        "lop3.b32 $0, $0, $4, m0, 0xD8;",
        "lop3.b32 $1, $1, $5, m1, 0xD8;",
        # channels p + D/2: d in bits 3-5, sign in bit 6; a raw block's high byte is its patch byte
        "shr.b32 t, $8, 3;",
        "and.b32 t, t, 0x07070707;",
        "add.u32 t, t, hb;",
        "shl.b32 u, $8, 1;",
        "lop3.b32 h, t, u, 0x80808080, 0xF8;",
        "lop3.b32 h, h, $10, rb, 0xD8;",
        "prmt.b32 $2, $4, h, 0x5341;",
        "prmt.b32 $3, $5, h, 0x7361;",
        "lop3.b32 $2, $2, $6, m0, 0xD8;",
        "lop3.b32 $3, $3, $7, m1, 0xD8;",
        "}",
    ]
    return "\n" + "\n".join(lines) + "\n"


_RESTORE_V3_PTX = tl.constexpr(restore_program_v3())


@triton.jit
def _restore_v3(pair, raw_b, code, marker, patch, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr):
    """Both bf16 [N, D/2] halves from the pair words (bf16-typed), raw pages' second halves (bf16), code
    bytes, per-value metadata bytes (0xFF on rows of raw pages and rows past the context) and patch bytes
    (uint8 [N, D/2] each)."""
    if USE_ASM:
        out_a, out_b = tl.inline_asm_elementwise(
            _RESTORE_V3_PTX,
            "=r,=r,=r,=r,r,r,r,r,r,r,r",
            [pair, raw_b, code, marker, patch],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=False,  # the dots must see a 16-bit origin, as in the twin (decode_tiles._bf16_boundary)
            pack=4,
        )
    else:
        w = pair.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        c = code.to(tl.int32)
        m = marker.to(tl.int32)
        hb = m & 0x7F
        raw_block = m >= 0x80
        high_a = tl.where(raw_block, c, ((c & 0x07) + hb) | (c & 0x80))
        high_b = tl.where(raw_block, patch.to(tl.int32), (((c >> 3) & 0x07) + hb) | ((c << 1) & 0x80))
        bits_a = (high_a << 8) | (w & 0xFF)
        bits_b = (high_b << 8) | (w >> 8)
        raw_page = m == 0xFF
        out_a = tl.where(raw_page, pair, bits_a.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_b = tl.where(raw_page, raw_b, bits_b.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_a = _bf16_boundary(out_a, INTERPRET)
        out_b = _bf16_boundary(out_b, INTERPRET)
    return out_a, out_b


@triton.jit
def _row_starts_v3(
    tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta_u8, page_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Per token row of page-head ``page_head``: (byte offset of its raw row if its page is stored raw, else
    of its page-head record; byte index of the page-head's metadata row, or -1 for raw pages and rows past
    the context)."""
    page_id = tl.load(page_ids_ptr + page_base + tok // 16, mask=valid, other=0)
    loc = tl.load(page_loc_ptr + page_id, mask=valid, other=0)
    meta_at = (page_id.to(tl.int64) * (2 * NUM_KV_HEADS) + page_head) * (HEAD_DIM // 8)
    first = tl.load(meta_u8 + meta_at, mask=valid, other=0xFF)  # a raw page's every byte is 0xFF
    raw_page = first == 0xFF
    raw_row = loc + page_head * (32 * HEAD_DIM) + (tok % 16) * (2 * HEAD_DIM)
    record = loc + page_head * (24 * HEAD_DIM)
    start = tl.where(raw_page, raw_row, record)
    meta_at = tl.where(raw_page, -1, meta_at)
    return start, meta_at


@triton.jit
def _kv_row_starts_v3(
    tok, end, page_base, page_ids_ptr, page_loc_ptr, meta_u8, head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """:func:`_row_starts_v3` of a tile's K rows and V rows: (k_start, k_meta, v_start, v_meta)."""
    valid = tok < end
    k_start, k_meta = _row_starts_v3(
        tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta_u8, head, NUM_KV_HEADS, HEAD_DIM
    )  # fmt: skip
    v_start, v_meta = _row_starts_v3(
        tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta_u8, NUM_KV_HEADS + head, NUM_KV_HEADS,
        HEAD_DIM,
    )  # fmt: skip
    return k_start, k_meta, v_start, v_meta


@triton.jit
def _tile_loads_v3(
    heap_u8, heap_bf16, meta_u8, start, meta_at, tok, valid, patch_gap,
    HEAD_DIM: tl.constexpr, ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """Issue a v3 tile's loads: (pair words, raw pages' second halves, code bytes, metadata bytes, patch
    bytes), each [N, D/2]. ``patch_gap``: bytes from the page-head's record to its page's first patch.
    Rows past the context take the raw path, zero-filled with ZERO_FILL (V, so p @ V stays finite; K there
    only feeds scores masked to -inf).

    Loads by 4 pairs: block G's code bytes are [16 tokens][4 pairs], its patch alike, so a row's four code
    (or patch) bytes of one block are one aligned 32-bit word; the hints say so, since Triton cannot see it
    through the data-dependent patch rank. The metadata is loaded once per block (a page-head's D/8 bytes,
    one vector load per row) and spread over the block's 4 pairs in registers."""
    HALF: tl.constexpr = HEAD_DIM // 2
    NB: tl.constexpr = HEAD_DIM // 8
    N: tl.constexpr = tok.shape[0]
    p = tl.arange(0, HALF)[None, :]
    t = (tok % 16)[:, None]
    raw = meta_at < 0  # page stored raw, or row past the context
    coded = (~raw)[:, None]
    raw_row = (valid & raw)[:, None]
    meta_row = tl.multiple_of(tl.maximum(meta_at, 0), NB)[:, None]  # page_meta rows are D/8 bytes apart
    per_block = tl.load(meta_u8 + meta_row + tl.arange(0, NB)[None, :], mask=coded, other=0xFF)
    marker = tl.reshape(tl.broadcast_to(per_block[:, :, None], [N, NB, 4]), [N, HALF])
    pair_row = tl.multiple_of(tl.where(raw, start, start + (tok % 16) * HEAD_DIM) // 2, 8)[:, None]
    raw_half = tl.multiple_of(start // 2, 8)[:, None] + HALF
    inner = 4 * t + p % 4  # (token, pair) inside its block's 64 code bytes, or its patch's
    code_at = start[:, None] + (16 * HEAD_DIM + 64 * (p // 4) + inner)
    code = tl.load(heap_u8 + tl.max_contiguous(tl.multiple_of(code_at, [1, 4]), [1, 4]), mask=coded)
    patch_at = start[:, None] + patch_gap + (marker & 0x7F).to(tl.int32) * 64 + inner
    patch_at = tl.max_contiguous(tl.multiple_of(patch_at, [1, 4]), [1, 4])
    patch = tl.load(heap_u8 + patch_at, mask=tl.max_constancy(coded & (marker >= 0x80), [1, 4]))
    if ZERO_FILL:
        pair = tl.load(heap_bf16 + pair_row + p, mask=valid[:, None], other=0.0)
        raw_b = tl.load(heap_bf16 + raw_half + p, mask=raw_row, other=0.0)
    else:
        pair = tl.load(heap_bf16 + pair_row + p, mask=valid[:, None])
        raw_b = tl.load(heap_bf16 + raw_half + p, mask=raw_row)
    return pair, raw_b, code, marker, patch


@triton.jit
def _load_tile_v3(
    heap_u8, heap_bf16, meta_u8, start, meta_at, tok, valid, patch_gap,
    HEAD_DIM: tl.constexpr, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr, ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """The two bf16 [N, D/2] halves of a v3 K or V tile, restored in registers."""
    pair, raw_b, code, marker, patch = _tile_loads_v3(
        heap_u8, heap_bf16, meta_u8, start, meta_at, tok, valid, patch_gap, HEAD_DIM, ZERO_FILL
    )
    return _restore_v3(pair, raw_b, code, marker, patch, USE_ASM, INTERPRET)


@triton.jit
def _patch_gaps(head, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Bytes from K's and V's page-head records (``head`` and ``NUM_KV_HEADS + head``) to the page's
    patches, which follow the last of its 2H records."""
    k_gap = (2 * NUM_KV_HEADS - head) * (24 * HEAD_DIM)
    v_gap = (NUM_KV_HEADS - head) * (24 * HEAD_DIM)
    return k_gap, v_gap
