"""Fused paged decode attention over compressed pages (one query token per request).

Each program handles one (request, KV head, split): all ``Hq / H`` query heads of the KV head at once
(padded to 16 rows so ``tl.dot`` applies), so every K/V tile is read and restored once. A tile is
``BLOCK_N`` tokens; each token row of a page-head sits in one block (token-major blocks, layout.py), which
is either compressed (restored to BF16 in registers right before the dot products) or raw. The choice
is made per row without a branch: raw rows load bf16 and compressed rows load low bytes and codes
through masked loads, and one select picks per row. Nothing is decompressed to device memory.

Restore (layout.py): a code byte pairs channel ``k`` with ``k + D/2`` of the same token, so the two
head_dim halves come out as two ``[BLOCK_N, D/2]`` tiles, one dot product each. On the GPU four values
are restored per 32-bit register with masks, one byte-wise add of ``b/2`` and two ``prmt`` byte
interleaves (``tl.inline_asm_elementwise``, pack=4); under the interpreter a plain-integer path does
the same per value.

``compressed=False`` is the uncompressed twin: the same kernel source with a constexpr switch that reads
every page as a raw page (no metadata). On pages holding the same values the two return bit-identical
outputs: the restored tiles are the same bits, and everything after them is the same code.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .decode_plan import DecodePlan, plan_decode
from .layout import PAGE_TOKENS, RAW_MARKER

__all__ = ["DecodePlan", "decode_attention", "plan_decode"]

_LOG2E = 1.4426950408889634
_MIN_DOT_ROWS = 16
if PAGE_TOKENS != 16 or RAW_MARKER != 0xFF:
    raise ImportError("decode_attention hard-codes 16-token pages and the 0xFF raw marker (layout.py)")

# Four values per call: $4/$5 low bytes of channels k and k + D/2, $6 their code bytes, $7 each value's
# block marker (b/2, or 0xFF for a raw block), $8-$11 the same values read as raw bf16 (pairs).
# high = (d + b/2) | sign, four bytes at once (no carries: b/2 + d <= 127, and the marker is masked to 7
# bits first); prmt interleaves low and high bytes into bf16 pairs; a raw block's marker has its top bit
# set, which prmt's sign-replicate mode spreads into a 16-bit mask per value that selects the raw pair.
# Outputs: $0/$1 channels k..k+3, $2/$3 channels k + D/2 ...
_RESTORE_PTX = tl.constexpr("""
{
.reg .b32 t, u, h, hb, m0, m1;
prmt.b32 m0, $7, 0, 0x9988;
prmt.b32 m1, $7, 0, 0xBBAA;
and.b32 hb, $7, 0x7F7F7F7F;
and.b32 t, $6, 0x07070707;
add.u32 t, t, hb;
lop3.b32 h, t, $6, 0x80808080, 0xF8;
prmt.b32 $0, $4, h, 0x5140;
prmt.b32 $1, $4, h, 0x7362;
lop3.b32 $0, $0, $8, m0, 0xD8;
lop3.b32 $1, $1, $9, m1, 0xD8;
shr.b32 t, $6, 3;
and.b32 t, t, 0x07070707;
add.u32 t, t, hb;
shl.b32 u, $6, 1;
lop3.b32 h, t, u, 0x80808080, 0xF8;
prmt.b32 $2, $5, h, 0x5140;
prmt.b32 $3, $5, h, 0x7362;
lop3.b32 $2, $2, $10, m0, 0xD8;
lop3.b32 $3, $3, $11, m1, 0xD8;
}
""")


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
    q_a, q_b, k_a, k_b, v_a, v_b, valid, m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT: tl.constexpr
):  # fmt: skip
    """One online-softmax step over a tile: scores, running max and sum, rescaled P @ V."""
    if FP32_DOT:
        s = tl.dot(q_a, tl.trans(k_a.to(tl.float32)))
        s = tl.dot(q_b, tl.trans(k_b.to(tl.float32)), s)
    else:
        s = tl.dot(q_a, tl.trans(k_a))
        s = tl.dot(q_b, tl.trans(k_b), s)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
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
def _decode_kernel(
    q_ptr, out_ptr, o_part_ptr, lse_part_ptr,
    heap_u8, heap_bf16, page_loc_ptr, meta32_ptr,
    page_ids_ptr, page_indptr_ptr, kv_lens_ptr, num_splits_ptr, split_tokens_ptr,
    qk_scale, stride_qb, stride_qh, stride_ob, stride_oh, max_splits,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, META_WORDS: tl.constexpr,
    BLOCKS_PER_HEAD: tl.constexpr, COMPRESSED: tl.constexpr, USE_ASM: tl.constexpr,
    FP32_DOT: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    pid = tl.program_id(0)
    split = pid % max_splits
    head = (pid // max_splits) % NUM_KV_HEADS
    req = pid // (max_splits * NUM_KV_HEADS)
    if split < tl.load(num_splits_ptr + req):
        kv_len = tl.load(kv_lens_ptr + req)
        split_tokens = tl.load(split_tokens_ptr + req)
        page_base = tl.load(page_indptr_ptr + req)
        first = split * split_tokens
        end = tl.minimum(kv_len, first + split_tokens)

        g = tl.arange(0, G_PAD)
        q_head = head * GROUP + g
        ch = tl.arange(0, HALF)[None, :]
        q_rows = q_ptr + req * stride_qb + q_head[:, None] * stride_qh
        q_mask = (g < GROUP)[:, None]
        q_a = tl.load(q_rows + ch, mask=q_mask, other=0.0)
        q_b = tl.load(q_rows + HALF + ch, mask=q_mask, other=0.0)
        if FP32_DOT:
            q_a = q_a.to(tl.float32)
            q_b = q_b.to(tl.float32)

        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc_a = tl.zeros([G_PAD, HALF], tl.float32)
        acc_b = tl.zeros([G_PAD, HALF], tl.float32)

        offs_n = tl.arange(0, BLOCK_N)
        tok = first + offs_n
        valid = tok < end
        # Row addresses run one tile ahead: page table -> page location -> metadata is a chain of
        # dependent loads that would otherwise stall every tile before its data loads can start.
        k_start, k_marker = _row_starts(
            tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
        )  # fmt: skip
        v_start, v_marker = _row_starts(
            tok, valid, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, NUM_KV_HEADS + head,
            NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
        )  # fmt: skip
        if PREFETCH and COMPRESSED:
            # Register double-buffering: the next tile's loads are in flight while this one computes.
            kl_a, kl_b, k_code, kr_a, kr_b = _tile_loads(
                heap_u8, heap_bf16, k_start, k_marker, tok, valid, HEAD_DIM, False
            )
            vl_a, vl_b, v_code, vr_a, vr_b = _tile_loads(
                heap_u8, heap_bf16, v_start, v_marker, tok, valid, HEAD_DIM, True
            )
            k_mark = k_marker
            v_mark = v_marker
            nxt = tok + BLOCK_N
            k_start, k_marker = _row_starts(
                nxt, nxt < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
                NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
            )  # fmt: skip
            v_start, v_marker = _row_starts(
                nxt, nxt < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, NUM_KV_HEADS + head,
                NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
            )  # fmt: skip
            for tile in range(first, end, BLOCK_N):
                tok = tile + offs_n
                valid = tok < end
                c_kl_a, c_kl_b, c_k_code, c_kr_a, c_kr_b, c_k_mark = kl_a, kl_b, k_code, kr_a, kr_b, k_mark
                c_vl_a, c_vl_b, c_v_code, c_vr_a, c_vr_b, c_v_mark = vl_a, vl_b, v_code, vr_a, vr_b, v_mark
                nxt = tok + BLOCK_N
                kl_a, kl_b, k_code, kr_a, kr_b = _tile_loads(
                    heap_u8, heap_bf16, k_start, k_marker, nxt, nxt < end, HEAD_DIM, False
                )
                vl_a, vl_b, v_code, vr_a, vr_b = _tile_loads(
                    heap_u8, heap_bf16, v_start, v_marker, nxt, nxt < end, HEAD_DIM, True
                )
                k_mark = k_marker
                v_mark = v_marker
                nn = nxt + BLOCK_N
                k_start, k_marker = _row_starts(
                    nn, nn < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
                    NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
                )  # fmt: skip
                v_start, v_marker = _row_starts(
                    nn, nn < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, NUM_KV_HEADS + head,
                    NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
                )  # fmt: skip
                k_a, k_b = _restore(
                    c_kl_a,
                    c_kl_b,
                    c_k_code,
                    c_k_mark.to(tl.uint8)[:, None],
                    c_kr_a,
                    c_kr_b,
                    USE_ASM,
                    FP32_DOT,
                )
                v_a, v_b = _restore(
                    c_vl_a,
                    c_vl_b,
                    c_v_code,
                    c_v_mark.to(tl.uint8)[:, None],
                    c_vr_a,
                    c_vr_b,
                    USE_ASM,
                    FP32_DOT,
                )
                m_i, l_i, acc_a, acc_b = _attend_tile(
                    q_a, q_b, k_a, k_b, v_a, v_b, valid, m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT
                )
        else:
            for tile in range(first, end, BLOCK_N):
                tok = tile + offs_n
                valid = tok < end
                k_a, k_b = _load_tile(
                    heap_u8, heap_bf16, k_start, k_marker, tok, valid, HEAD_DIM, COMPRESSED, USE_ASM,
                    FP32_DOT, False,
                )  # fmt: skip
                v_a, v_b = _load_tile(
                    heap_u8, heap_bf16, v_start, v_marker, tok, valid, HEAD_DIM, COMPRESSED, USE_ASM,
                    FP32_DOT, True,
                )  # fmt: skip
                nxt = tok + BLOCK_N
                k_start, k_marker = _row_starts(
                    nxt, nxt < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, head,
                    NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
                )  # fmt: skip
                v_start, v_marker = _row_starts(
                    nxt, nxt < end, page_base, page_ids_ptr, page_loc_ptr, meta32_ptr, NUM_KV_HEADS + head,
                    NUM_KV_HEADS, HEAD_DIM, META_WORDS, BLOCKS_PER_HEAD, COMPRESSED,
                )  # fmt: skip
                m_i, l_i, acc_a, acc_b = _attend_tile(
                    q_a, q_b, k_a, k_b, v_a, v_b, valid, m_i, l_i, acc_a, acc_b, qk_scale, FP32_DOT
                )

        out_a = acc_a / l_i[:, None]
        out_b = acc_b / l_i[:, None]
        if not SPLIT:
            o_rows = out_ptr + req * stride_ob + q_head[:, None] * stride_oh
            tl.store(o_rows + ch, out_a.to(tl.bfloat16), mask=q_mask)
            tl.store(o_rows + HALF + ch, out_b.to(tl.bfloat16), mask=q_mask)
        else:
            part = (req * NUM_KV_HEADS * GROUP + q_head) * max_splits + split  # [G_PAD]
            tl.store(o_part_ptr + part[:, None] * HEAD_DIM + ch, out_a, mask=q_mask)
            tl.store(o_part_ptr + part[:, None] * HEAD_DIM + HALF + ch, out_b, mask=q_mask)
            tl.store(lse_part_ptr + part, m_i + tl.log2(l_i), mask=g < GROUP)


@triton.jit
def _merge_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, num_splits_ptr, stride_ob, stride_oh, max_splits,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Combine one (request, query head)'s split outputs by their log2-sum-exp2."""
    req = tl.program_id(0)
    q_head = tl.program_id(1)
    n = tl.load(num_splits_ptr + req)
    base = (req * NUM_Q_HEADS + q_head) * max_splits
    offs = tl.arange(0, CHUNK)
    d = tl.arange(0, HEAD_DIM)
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), 0)
    for s0 in range(0, n, CHUNK):
        lse = tl.load(lse_part_ptr + base + s0 + offs, mask=s0 + offs < n, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    acc = tl.zeros([HEAD_DIM], tl.float32)
    den = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    for s0 in range(0, n, CHUNK):
        live = s0 + offs < n
        w = tl.exp2(tl.load(lse_part_ptr + base + s0 + offs, mask=live, other=float("-inf")) - m)
        o = tl.load(
            o_part_ptr + (base + s0 + offs)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0
        )
        acc += tl.sum(w[:, None] * o, 0)
        den += tl.sum(w, 0)
    tl.store(out_ptr + req * stride_ob + q_head * stride_oh + d, (acc / den).to(tl.bfloat16))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_inputs(
    plan: DecodePlan, q: torch.Tensor, heap: torch.Tensor, page_loc: torch.Tensor, page_meta: torch.Tensor
) -> None:
    fmt = plan.fmt
    want_q = (plan.batch_size, plan.num_q_heads, fmt.head_dim)
    if q.dtype != torch.bfloat16 or tuple(q.shape) != want_q or q.stride(-1) != 1:
        raise ValueError(
            f"q must be bf16 {list(want_q)} with unit last stride, got {q.dtype} {list(q.shape)}"
        )
    if heap.dtype != torch.uint8 or heap.dim() != 1 or heap.numel() % 4 != 0:
        raise ValueError(
            f"heap must be a 1-D uint8 tensor of a multiple of 4 bytes, got {heap.dtype} {list(heap.shape)}"
        )
    if page_loc.dtype != torch.int64 or page_loc.dim() != 1:
        raise ValueError(
            f"page_loc_layer must be int64 [max_pages], got {page_loc.dtype} {list(page_loc.shape)}"
        )
    want_meta = (page_loc.numel(), fmt.page_heads_per_page, fmt.meta_bytes)
    if page_meta.dtype != torch.uint8 or tuple(page_meta.shape) != want_meta or not page_meta.is_contiguous():
        raise ValueError(
            f"page_meta_layer must be contiguous uint8 {list(want_meta)}, "
            f"got {page_meta.dtype} {list(page_meta.shape)}"
        )
    devices = {t.device for t in (q, heap, page_loc, page_meta, plan.page_ids, plan.kv_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def decode_attention(
    plan: DecodePlan,
    q: torch.Tensor,
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    sm_scale: float,
    compressed: bool = True,
    out: torch.Tensor | None = None,
    use_asm: bool | None = None,
) -> torch.Tensor:
    """bf16 ``[B, Hq, D]`` attention output of ``q`` (bf16 ``[B, Hq, D]``) over one layer's pages.

    ``compressed=False`` runs the uncompressed twin (every page read as raw). ``use_asm`` picks the
    restore path (default: PTX on the GPU, plain integers under the interpreter).
    """
    _check_inputs(plan, q, heap, page_loc_layer, page_meta_layer)
    fmt = plan.fmt
    interpret = _interpreting()
    if use_asm is None:
        use_asm = not interpret
    if use_asm and interpret:
        raise ValueError("the PTX restore cannot run under TRITON_INTERPRET=1; pass use_asm=False")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != torch.bfloat16 or out.stride(-1) != 1:
        raise ValueError(
            f"out must be bf16 {list(q.shape)} with unit last stride, got {out.dtype} {list(out.shape)}"
        )
    group = plan.group_size
    grid = (plan.batch_size * fmt.num_kv_heads * plan.max_splits,)
    _decode_kernel[grid](
        q, out, plan.o_partial, plan.lse_partial,
        heap, heap.view(torch.bfloat16), page_loc_layer, page_meta_layer.view(torch.int32),
        plan.page_ids, plan.page_indptr, plan.kv_lens, plan.num_splits, plan.split_tokens,
        sm_scale * _LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1), plan.max_splits,
        NUM_KV_HEADS=fmt.num_kv_heads, GROUP=group, G_PAD=max(_MIN_DOT_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=fmt.head_dim, BLOCK_N=plan.block_n, SPLIT=plan.max_splits > 1,
        META_WORDS=fmt.meta_bytes // 4, BLOCKS_PER_HEAD=fmt.blocks_per_page_head,
        COMPRESSED=compressed, USE_ASM=use_asm, FP32_DOT=interpret, PREFETCH=plan.prefetch,
        num_warps=plan.num_warps, num_stages=plan.num_stages if compressed else plan.twin_num_stages,
    )  # fmt: skip
    if plan.max_splits > 1:
        _merge_kernel[(plan.batch_size, plan.num_q_heads)](
            plan.o_partial, plan.lse_partial, out, plan.num_splits, out.stride(0), out.stride(1),
            plan.max_splits, NUM_Q_HEADS=plan.num_q_heads, HEAD_DIM=fmt.head_dim, CHUNK=16,
            num_warps=4,
        )  # fmt: skip
    return out
