"""Tile-level Triton helpers of the fused decode attention kernel (kernels/attention/decode.py).

Per K or V tile of ``BLOCK_N`` token rows: where each row's block lives (page table -> page location ->
page metadata), the loads (low bytes and codes of compressed rows, bf16 of raw rows, all masked per row,
so the raw/compressed choice needs no branch), the restore to BF16 in registers, and one online-softmax
step over the tile. The compressed kernel and its uncompressed twin share all of it except the loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..format.layout import PAGE_TOKENS, RAW_MARKER

if PAGE_TOKENS != 16 or RAW_MARKER != 0xFF:
    raise ImportError("the decode tiles hard-code 16-token pages and the 0xFF raw marker (format/layout.py)")


def restore_program(code: str, marker: str, picks: tuple[tuple[str, str], ...], raws: tuple[str, ...]) -> str:
    """The PTX that restores four values per output register pair, for either page format version.

    ``code``/``marker``: the registers of four code bytes and of each value's block marker (b/2, or 0xFF for
    a raw block). ``picks``: per output $0..$3, the register holding its low bytes and the prmt selector that
    interleaves them with the high bytes. ``raws``: per output, the register of the same values read as raw
    bf16 pairs. high = (d + b/2) | sign, four bytes at once (no carries: b/2 + d <= 127, and the marker is
    masked to 7 bits first); the first pair of outputs takes d and the sign from bits 0-2 and 7 of the code,
    the second from bits 3-5 and 6. A raw block's marker has its top bit set, which prmt's sign-replicate
    mode spreads into a 16-bit mask per value that selects the raw pair instead.
    """
    first = [
        "and.b32 t, {code}, 0x07070707;",
        "add.u32 t, t, hb;",
        "lop3.b32 h, t, {code}, 0x80808080, 0xF8;",
    ]
    second = [
        "shr.b32 t, {code}, 3;",
        "and.b32 t, t, 0x07070707;",
        "add.u32 t, t, hb;",
        "shl.b32 u, {code}, 1;",
        "lop3.b32 h, t, u, 0x80808080, 0xF8;",
    ]
    lines = [
        "{",
        ".reg .b32 t, u, h, hb, m0, m1;",
        f"prmt.b32 m0, {marker}, 0, 0x9988;",
        f"prmt.b32 m1, {marker}, 0, 0xBBAA;",
        f"and.b32 hb, {marker}, 0x7F7F7F7F;",
    ]
    for half, high in ((0, first), (1, second)):
        lines += [line.format(code=code) for line in high]
        outs = (2 * half, 2 * half + 1)
        lines += [f"prmt.b32 ${o}, {picks[o][0]}, h, {picks[o][1]};" for o in outs]
        lines += [f"lop3.b32 ${o}, ${o}, {raws[o]}, m{o % 2}, 0xD8;" for o in outs]
    return "\n" + "\n".join([*lines, "}"]) + "\n"


# v1: $4/$5 low bytes of channels k and k + D/2, $6 their code bytes, $7 the markers, $8-$11 the same values
# read as raw bf16 (pairs). Outputs: $0/$1 channels k..k+3, $2/$3 channels k + D/2 ...
_RESTORE_PTX = tl.constexpr(
    restore_program(
        "$6",
        "$7",
        (("$4", "0x5140"), ("$4", "0x7362"), ("$5", "0x5140"), ("$5", "0x7362")),
        ("$8", "$9", "$10", "$11"),
    )
)


@triton.jit
def _bf16_boundary(x, INTERPRET: tl.constexpr):
    """Identity on a bf16 tile that Triton's dot-operand analysis cannot see through.

    Triton picks the MMA operand packing (kWidth) from the narrowest load an operand derives from, and a
    different packing permutes the k order inside each mma instruction, which changes fp32 rounding. A
    restored tile derives from uint8 loads, the twin's from bf16 loads: without this boundary the two
    would not be bit-identical. An impure asm statement ends that backward walk; ptxas drops the move.
    """
    if not INTERPRET:
        x = tl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r", [x], dtype=tl.bfloat16, is_pure=False, pack=2
        )
    return x


@triton.jit
def _restore(low_a, low_b, code, marker, raw_a, raw_b, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr):
    """Both bf16 [N, D/2] halves of a tile: restored from low bytes + codes (uint8 [N, D/2]) where the
    row's block marker (uint8 [N, 1]) is b/2, taken from ``raw_a``/``raw_b`` where it is 0xFF."""
    if USE_ASM:
        out_a, out_b = tl.inline_asm_elementwise(
            _RESTORE_PTX,
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r",
            [low_a, low_b, code, marker, raw_a, raw_b],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=False,  # see _bf16_boundary: the dots must see a 16-bit origin, as in the twin
            pack=4,
        )
    else:
        c = code.to(tl.int32)
        hb = marker.to(tl.int32) & 0x7F
        high_a = ((c & 0x07) + hb) | (c & 0x80)
        high_b = (((c >> 3) & 0x07) + hb) | ((c << 1) & 0x80)
        bits_a = (high_a << 8) | low_a.to(tl.int32)
        bits_b = (high_b << 8) | low_b.to(tl.int32)
        is_raw = marker == 0xFF
        out_a = tl.where(is_raw, raw_a, bits_a.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_b = tl.where(is_raw, raw_b, bits_b.to(tl.int16).to(tl.bfloat16, bitcast=True))
        out_a = _bf16_boundary(out_a, INTERPRET)
        out_b = _bf16_boundary(out_b, INTERPRET)
    return out_a, out_b


@triton.jit
def _row_starts(
    tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, page_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, COMPRESSED: tl.constexpr,
):  # fmt: skip
    """Per token row: (byte offset of its block, or of its raw row in the twin; its block's marker)."""
    page_id = tl.load(page_ids_ptr + page_base + tok // 16, mask=valid, other=0)
    loc = tl.load(page_loc_ptr + page_id, mask=valid, other=0)
    in_page = tok % 16
    if COMPRESSED:
        meta_row = (page_id.to(tl.int64) * (2 * NUM_KV_HEADS) + page_head) * META_WORDS
        head_offset = tl.load(meta32_ptr + meta_row, mask=valid, other=0)
        word0 = tl.load(meta32_ptr + meta_row + 1, mask=valid, other=-1)  # invalid rows read as raw
        word1 = word0
        if BLOCKS_PER_HEAD > 4:
            word1 = tl.load(meta32_ptr + meta_row + 2, mask=valid, other=-1)
        block = in_page // (512 // HEAD_DIM)
        raw_before = tl.zeros_like(block)
        marker = tl.zeros_like(block)
        for i in tl.static_range(BLOCKS_PER_HEAD):
            if i < 4:  # noqa: SIM108 - i is a compile-time constant
                m = (word0 >> (8 * i)) & 0xFF
            else:
                m = (word1 >> (8 * (i - 4))) & 0xFF
            raw_before += ((m == 0xFF) & (block > i)).to(tl.int32)
            marker = tl.where(block == i, m, marker)
        start = tl.multiple_of(loc + head_offset + block * 768 + raw_before * 256, 256)
    else:
        start = tl.multiple_of(loc + page_head * (16 * HEAD_DIM * 2) + in_page * (HEAD_DIM * 2), 2 * HEAD_DIM)
        marker = tl.zeros_like(tok) + 0xFF
    return start, marker


@triton.jit
def _kv_row_starts(
    tok, end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, COMPRESSED: tl.constexpr,
):  # fmt: skip
    """:func:`_row_starts` of a tile's K rows and V rows (page-heads ``head`` and ``NUM_KV_HEADS + head``):
    (k_start, k_marker, v_start, v_marker)."""
    valid = tok < end
    k_start, k_marker = _row_starts(
        tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
        NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
    )  # fmt: skip
    v_start, v_marker = _row_starts(
        tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, NUM_KV_HEADS + head,
        NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
    )  # fmt: skip
    return k_start, k_marker, v_start, v_marker


@triton.jit
def _tile_loads(
    heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM: tl.constexpr, ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """Issue a compressed-page tile's loads: low bytes and codes of compressed rows, bf16 of raw rows.

    Masked-off lanes keep whatever the registers held (no zero fill): the restore's select drops them,
    and rows past the context are raw rows whose V reads are zero-filled (ZERO_FILL) so p @ V stays
    finite; K there only feeds scores that are masked to -inf.
    """
    HALF: tl.constexpr = HEAD_DIM // 2
    ch = tl.arange(0, HALF)[None, :]
    t = (tok % 16) % (512 // HEAD_DIM)  # token row inside its block
    is_raw = marker == 0xFF
    comp = (valid & ~is_raw)[:, None]
    raw = (valid & is_raw)[:, None]
    low_row = tl.multiple_of(start + t * HEAD_DIM, 64)[:, None]
    code_row = tl.multiple_of(start + 512 + t * HALF, 32)[:, None]
    raw_row = tl.multiple_of((start + t * (2 * HEAD_DIM)) // 2, 64)[:, None]
    low_a = tl.load(heap_u8 + low_row + ch, mask=comp)
    low_b = tl.load(heap_u8 + low_row + HALF + ch, mask=comp)
    code = tl.load(heap_u8 + code_row + ch, mask=comp)
    if ZERO_FILL:
        raw_a = tl.load(heap_bf16 + raw_row + ch, mask=raw, other=0.0)
        raw_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=raw, other=0.0)
    else:
        raw_a = tl.load(heap_bf16 + raw_row + ch, mask=raw)
        raw_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=raw)
    return low_a, low_b, code, raw_a, raw_b


@triton.jit
def _load_tile(
    heap_u8, heap_bf16, start, marker, tok, valid,
    HEAD_DIM: tl.constexpr, COMPRESSED: tl.constexpr, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr,
    ZERO_FILL: tl.constexpr,
):  # fmt: skip
    """The two bf16 [N, D/2] halves of a K or V tile, restored in registers where compressed."""
    HALF: tl.constexpr = HEAD_DIM // 2
    ch = tl.arange(0, HALF)[None, :]
    if COMPRESSED:
        low_a, low_b, code, raw_a, raw_b = _tile_loads(
            heap_u8, heap_bf16, start, marker, tok, valid, HEAD_DIM, ZERO_FILL
        )
        out_a, out_b = _restore(
            low_a, low_b, code, marker.to(tl.uint8)[:, None], raw_a, raw_b, USE_ASM, INTERPRET
        )
    else:
        raw_row = tl.multiple_of(start // 2, 64)[:, None]
        if ZERO_FILL:
            out_a = tl.load(heap_bf16 + raw_row + ch, mask=valid[:, None], other=0.0)
            out_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=valid[:, None], other=0.0)
        else:
            out_a = tl.load(heap_bf16 + raw_row + ch, mask=valid[:, None])
            out_b = tl.load(heap_bf16 + raw_row + HALF + ch, mask=valid[:, None])
    return out_a, out_b


@triton.jit
def _attend_tile(
    q_a, q_b, k_a, k_b, v_a, v_b, mask, m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT: tl.constexpr
):  # fmt: skip
    """One online-softmax step over a tile: scores, running max and sum, rescaled P @ V. ``mask``: which
    (query row, key) scores count, broadcast to [rows, N] ([1, N] in decode, causal [rows, N] in extend);
    every row must keep a score in the first tile it sees, or its running max stays -inf."""
    if FP32_DOT:
        s = tl.dot(q_a, tl.trans(k_a.to(tl.float32)))
        s = tl.dot(q_b, tl.trans(k_b.to(tl.float32)), s)
    else:
        s = tl.dot(q_a, tl.trans(k_a))
        s = tl.dot(q_b, tl.trans(k_b), s)
    s = tl.where(mask, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc_a = acc_a * alpha[:, None]
    acc_b = acc_b * alpha[:, None]
    if FP32_DOT:
        acc_a = tl.dot(p, v_a.to(tl.float32), acc_a)
        acc_b = tl.dot(p, v_b.to(tl.float32), acc_b)
    else:
        p16 = p.to(tl.bfloat16)
        acc_a = tl.dot(p16, v_a, acc_a)
        acc_b = tl.dot(p16, v_b, acc_b)
    return m_new, l_i, acc_a, acc_b


@triton.jit
def _start_rows(q_rows, q_mask, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, FP32_DOT: tl.constexpr):
    """The query rows (``q_rows``: pointers [ROWS, 1] to each row's first channel) as two [ROWS, D/2] halves,
    masked rows zero, and the online softmax's empty state: (q_a, q_b, m_i, l_i, acc_a, acc_b)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    ch = tl.arange(0, HALF)[None, :]
    q_a = tl.load(q_rows + ch, mask=q_mask, other=0.0)
    q_b = tl.load(q_rows + HALF + ch, mask=q_mask, other=0.0)
    if FP32_DOT:
        q_a = q_a.to(tl.float32)
        q_b = q_b.to(tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc_a = tl.zeros([ROWS, HALF], tl.float32)
    acc_b = tl.zeros([ROWS, HALF], tl.float32)
    return q_a, q_b, m_i, l_i, acc_a, acc_b
