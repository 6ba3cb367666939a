"""The Hopper decode kernel's restore (kernels/attention/hopper/decode.py): from a landed ring slot to the
bf16 K and V operands in the MMA fragments, one of three ways per tile (its docstring), and the attention over
a tile.

- coded tiles: a pre-pass turns every coded block's code words in B into high-byte pairs, in place and in
  the lo plane's order (a raw block takes its code slot and patch as they are), then :func:`_coded_operands`
  loads the lo plane (A) and the high-byte plane (B) with ``ldmatrix`` and interleaves them, four ``prmt``
  per eight values;
- raw tiles: A and B already hold bf16 (channels ``< D/2`` and ``>= D/2``): :func:`_raw_operands`;
- partial or mixed tiles: :func:`_stage_tile` gathers every page-head from global memory into the coded
  path's two planes (tokens past the end become 0), then the coded path's loads.
All hand the same bits to :func:`attend` for the same values.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.runtime.jit import constexpr_function

from .ring import _PT, CODED, GATHER, RAW

# $0: the bf16 pair of channels p (elements 0, 1), $1: of channels p + D/2, from $2 (A's elements 0, 1) and
# $3 (B's) by the selectors $4 and $6. Coded tiles: A holds lo-plane pairs (lo(p) | lo(p + D/2) << 8), B
# high-byte pairs, and the selectors interleave them; raw tiles: A and B hold the bf16 of channels p and
# p + D/2 and the selectors copy them. One path for both, so the operands never merge from two branches
# (the compiler would unpack and repack every 16-bit half).
_INTERLEAVE = ttgl.constexpr("""
{
prmt.b32 $0, $2, $3, $4;
prmt.b32 $1, $2, $3, $6;
}
""")
CODED_SEL = ttgl.constexpr((0x6240, 0x7351))
RAW_SEL = ttgl.constexpr((0x3210, 0x7654))
# $0, $1: high-byte pairs of pairs (j0, j1) and (j2, j3) of a block from its code word's bytes $2 (channels
# p) and $3 (channels p + D/2).
_PAIR_BYTES = ttgl.constexpr("""
{
prmt.b32 $0, $2, $3, 0x5140;
prmt.b32 $1, $2, $3, 0x7362;
}
""")


@constexpr_function
def prepass_layout(D, NP, NW):  # type: ignore[no-untyped-def]
    """[NP, D/8 blocks, 16 tokens, 2 words]: four tokens per thread, lanes along tokens then blocks, so a
    load of code words reads two whole blocks per 8 lanes and a store of high-byte pairs writes rows
    t, t+4, t+8, t+12 of four blocks, on disjoint banks under the lo plane's swizzle."""
    del D
    wp = min(NP, NW)
    return ttgl.BlockedLayout([1, 1, 4, 2], [1, 8, 4, 1], [wp, NW // wp, 1, 1], [3, 2, 1, 0])


@constexpr_function
def _rank(layout):  # type: ignore[no-untyped-def]
    return len(layout.warps_per_cta)


@gluon.jit
def _interleave(lo, hi, sel_a, sel_b):
    return ttgl.inline_asm_elementwise(
        _INTERLEAVE,
        "=r,=r,r,r,r,r,r,r",
        [lo, hi, sel_a, sel_b],
        dtype=(ttgl.bfloat16, ttgl.bfloat16),
        is_pure=True,
        pack=2,
    )


@gluon.jit
def _pair_bytes(hi_a, hi_b):
    return ttgl.inline_asm_elementwise(
        _PAIR_BYTES, "=r,=r,r,r", [hi_a, hi_b], dtype=(ttgl.uint32, ttgl.uint32), is_pure=True, pack=1
    )


@gluon.jit
def _load_code_words(
    b_buf,
    meta_buf,
    pre_l: ttgl.constexpr,
    CW: ttgl.constexpr,
    D: ttgl.constexpr,
    NP: ttgl.constexpr,
    PATCH: ttgl.constexpr,
    LEAN: ttgl.constexpr = False,
):
    """High bytes of every block of a coded tile, from B's code words (and, with PATCH, the raw blocks'
    code slots and patches): (channels p, channels p + D/2), uint32 [NP, D/8, 16 tokens], 4 pairs a word.
    LEAN: the twin's sign bit joins before the marker is added, so the add is the last step and the raw
    blocks' select predicates it alone (the same bits: no byte's add carries into its bit 7 either way, as
    hi_a's add already needs; the default's order costs a separate mask and OR after the predicated add)."""
    words = b_buf._reinterpret(ttgl.uint32, [NP, D // 8, 16, 2], CW).load(pre_l)
    h = ttgl.arange(0, 2, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, ttgl.SliceLayout(2, pre_l))))
    h = h[None, None, None, :]
    cd = ttgl.sum(ttgl.where(h == 0, words, 0), axis=3)
    mk_l: ttgl.constexpr = ttgl.SliceLayout(2, ttgl.SliceLayout(3, pre_l))
    marks = meta_buf.load(mk_l).to(ttgl.uint32)[:, :, None]
    bw = marks * 0x01010101
    hi_a = (cd & 0x87878787) + bw
    if LEAN:
        hi_b = (((cd >> 3) & 0x07070707) | ((cd << 1) & 0x80808080)) + bw
    else:
        hi_b = (((cd >> 3) & 0x07070707) + bw) | ((cd << 1) & 0x80808080)
    if PATCH:
        pt = ttgl.sum(ttgl.where(h == 1, words, 0), axis=3)
        is_raw = marks >= 0x80
        hi_a = ttgl.where(is_raw, cd, hi_a)
        hi_b = ttgl.where(is_raw, pt, hi_b)
    return hi_a, hi_b


@gluon.jit
def _store_hi_pairs(b_buf, hi_a, hi_b, HW: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr):
    """Write the high bytes as pairs (hi(p) | hi(p + D/2) << 8) in the lo plane's order over B."""
    w0, w1 = _pair_bytes(hi_a, hi_b)
    b_buf._reinterpret(ttgl.uint32, [NP, D // 8, 16, 2], HW).store(ttgl.join(w0, w1))


@gluon.jit
def _operands(a_buf, b_buf, sel, view: ttgl.constexpr, shape: ttgl.constexpr, op_l: ttgl.constexpr):
    """(channels < D/2, channels >= D/2) bf16 operands from A and B (``sel``: CODED_SEL's or RAW_SEL's)."""
    lo = a_buf._reinterpret(ttgl.uint16, shape, view).load(op_l)
    hi = b_buf._reinterpret(ttgl.uint16, shape, view).load(op_l)
    sel_a = ttgl.full(shape, sel[0], ttgl.uint32, layout=op_l)
    sel_b = ttgl.full(shape, sel[1], ttgl.uint32, layout=op_l)
    return _interleave(lo, hi, sel_a, sel_b)


@gluon.jit
def _stage_page(a_page, b_page, glob, tables, page_slot, tok_base, ph, st_l: ttgl.constexpr,
                PAGE_VIEW: ttgl.constexpr, H: ttgl.constexpr, D: ttgl.constexpr):  # fmt: skip
    """Gather one page-head (any kind) from global memory into the coded path's two planes: A's lo bytes
    and B's high bytes, both (x(p) | x(p + D/2) << 8) ``[16][D/2]``; tokens at or past ``end`` become 0."""
    heap_ptr, heap16_ptr = glob
    page_ids_ptr, page_loc_ptr, meta_ptr, _, end, _ = tables
    t = ttgl.arange(0, _PT, layout=ttgl.SliceLayout(1, st_l))[:, None]
    pair = ttgl.arange(0, D // 2, layout=ttgl.SliceLayout(0, st_l))[None, :]
    valid = tok_base + t < end
    page_live = tok_base < end
    pid = ttgl.load(page_ids_ptr + page_slot, mask=page_live, other=0)
    loc = ttgl.load(page_loc_ptr + pid, mask=page_live, other=0)
    row = pid.to(ttgl.int64) * (2 * H * (D // 8)) + ph * (D // 8)
    coded_pg = page_live & (ttgl.load(meta_ptr + row, mask=page_live, other=0xFF).to(ttgl.int32) != 0xFF)
    if coded_pg:
        mark = ttgl.load(meta_ptr + row + pair // 4).to(ttgl.int32)
        lo = ttgl.load(heap16_ptr + (loc + ph * (24 * D) + t * D) // 2 + pair).to(ttgl.int32) & 0xFFFF
        inner = 4 * t + pair % 4
        code = ttgl.load(heap_ptr + loc + ph * (24 * D) + 16 * D + (pair // 4) * 64 + inner).to(ttgl.int32)
        rawblk = mark >= 0x80
        patch = ttgl.load(
            heap_ptr + loc + 2 * H * (24 * D) + (mark & 0x7F) * 64 + inner, mask=rawblk, other=0
        )
        patch = patch.to(ttgl.int32)
        hi_a = ttgl.where(rawblk, code, ((code >> 7) << 7) | (mark + (code & 7)))
        hi_b = ttgl.where(rawblk, patch, (((code >> 6) & 1) << 7) | (mark + ((code >> 3) & 7)))
        hi = hi_a | (hi_b << 8)
    else:
        raw_row = (loc + ph * (32 * D) + t * (2 * D)) // 2 + pair
        x_a = ttgl.load(heap16_ptr + raw_row, mask=valid, other=0).to(ttgl.int32) & 0xFFFF
        x_b = ttgl.load(heap16_ptr + raw_row + D // 2, mask=valid, other=0).to(ttgl.int32) & 0xFFFF
        lo = (x_a & 0xFF) | ((x_b & 0xFF) << 8)
        hi = (x_a >> 8) | (x_b & 0xFF00)
    a_page._reinterpret(ttgl.uint16, [_PT, D // 2], PAGE_VIEW).store(ttgl.where(valid, lo, 0).to(ttgl.uint16))
    b_page._reinterpret(ttgl.uint16, [_PT, D // 2], PAGE_VIEW).store(ttgl.where(valid, hi, 0).to(ttgl.uint16))


@gluon.jit
def _stage_tile(a_buf, b_buf, glob, tables, tok0, ph, st_l: ttgl.constexpr, PAGE_VIEW: ttgl.constexpr,
                H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr):  # fmt: skip
    page_base = tables[3]
    for k in ttgl.static_range(NP):
        _stage_page(a_buf.slice(k, 1, dim=0), b_buf.slice(k, 1, dim=0), glob, tables,
                    page_base + tok0 // _PT + k, tok0 + k * _PT, ph, st_l, PAGE_VIEW, H, D)  # fmt: skip


@gluon.jit
def attend(
    qa,
    qb,
    ka,
    kb,
    va,
    vb,
    valid,
    m_i,
    l_acc,
    acc_a,
    acc_b,
    qk_scale,
    mma: ttgl.constexpr,
    a_l: ttgl.constexpr,
    M: ttgl.constexpr,
    N: ttgl.constexpr,
    LAZY: ttgl.constexpr = False,
):
    s = mma_v2(qa, ka, ttgl.zeros([M, N], ttgl.float32, layout=mma))
    s = mma_v2(qb, kb, s) * qk_scale
    s = ttgl.where(valid[None, :], s, float("-inf"))
    m_new = ttgl.maximum(m_i, ttgl.max(s, axis=1))
    alpha = ttgl.exp2(m_i - m_new)
    p = ttgl.exp2(s - m_new[:, None])
    if LAZY:  # the default's steps below, in its order, so that its compiled code stays as it was
        l_acc, acc_a, acc_b = _lazy_rescale(alpha, p, l_acc, acc_a, acc_b)
        alpha = ttgl.full_like(alpha, 1.0)  # acc * 1.0 below: folded away by the compiler
    else:
        l_acc = l_acc * alpha[:, None] + p
    p_dot = ttgl.convert_layout(p.to(ttgl.bfloat16), a_l)
    acc_a = mma_v2(p_dot, va, acc_a * alpha[:, None])
    acc_b = mma_v2(p_dot, vb, acc_b * alpha[:, None])
    return m_new, l_acc, acc_a, acc_b


@gluon.jit
def _lazy_rescale(alpha, p, l_acc, acc_a, acc_b):
    """:func:`attend`'s rescale, skipped when ``alpha`` is exactly 1 in every row (no row max grew): the
    same bits either way (x * 1.0 == x, fma(l, 1.0, p) == l + p), 32 multiplies fewer per thread and tile.
    Every warp holds every row's alpha (the row max is shared), so the test is a shuffle reduction inside
    the warp, no shared memory, and the branch is uniform."""
    grown = ttgl.max((alpha != 1.0).to(ttgl.int32), axis=0)
    if grown != 0:
        # fma spelled out: written as l * alpha + p, the compiler sinks the "+ p" common to both branches
        # below the join and splits the fma the default contracts into a multiply and an add
        l_acc = ttgl.fma(l_acc, alpha[:, None], p)
        acc_a = acc_a * alpha[:, None]
        acc_b = acc_b * alpha[:, None]
    else:
        l_acc = l_acc + p
    return l_acc, acc_a, acc_b


@gluon.jit
def _prepass(b_k, m_k, b_v, m_v, pre_l: ttgl.constexpr, CW: ttgl.constexpr, HW: ttgl.constexpr,
             D: ttgl.constexpr, NP: ttgl.constexpr, PATCH: ttgl.constexpr, LEAN: ttgl.constexpr):  # fmt: skip
    """Codes -> high-byte pairs in B for K and V (PATCH: the tile has raw blocks, which keep their bytes)."""
    # Read every code word of the tile before any high-byte pair overwrites one.
    hk_a, hk_b = _load_code_words(b_k, m_k, pre_l, CW, D, NP, PATCH, LEAN)
    hv_a, hv_b = _load_code_words(b_v, m_v, pre_l, CW, D, NP, PATCH, LEAN)
    ttgl.thread_barrier()
    _store_hi_pairs(b_k, hk_a, hk_b, HW, D, NP)
    _store_hi_pairs(b_v, hv_a, hv_b, HW, D, NP)
    ttgl.thread_barrier()


@gluon.jit
def tile_operands(kind, slot, glob, tables, tok0, OP_K: ttgl.constexpr, OP_V: ttgl.constexpr,
                  CW: ttgl.constexpr, HW: ttgl.constexpr, PG1: ttgl.constexpr, H: ttgl.constexpr,
                  D: ttgl.constexpr, NP: ttgl.constexpr, mma: ttgl.constexpr,
                  LEAN: ttgl.constexpr = False, PREPASSED: ttgl.constexpr = False):  # fmt: skip
    """(K_a, K_b, V_a, V_b) bf16 operands of a landed tile in the MMA B fragments (``kind``: how it is read;
    ``slot``: its ring buffers; ``glob``: (heap_ptr, heap16_ptr); ``tables``: ring.tile_info's; ``mma``:
    the kernel's MMA layout, 2D ``[M, X]`` or, per-warp softmax, 3D ``[NP, M, X]``, one page per warp).
    PREPASSED: a coded tile's B already holds high-byte pairs (hopper/specialized.py's producer ran the
    pre-pass, and an mbarrier orders its writes before these reads: no barrier here)."""
    a_k, b_k, a_v, b_v, m_k, m_v = slot
    head = tables[5]
    N: ttgl.constexpr = NP * _PT
    HALF: ttgl.constexpr = D // 2
    b_l: ttgl.constexpr = ttgl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    pre_l: ttgl.constexpr = prepass_layout(D, NP, ttgl.num_warps())
    st_l: ttgl.constexpr = ttgl.BlockedLayout(
        [1, 4], [4, 8], [ttgl.num_warps(), 1], [1, 0]
    )  # one page-head [16, D/2]
    if kind == GATHER:  # a partial or mixed tile: nothing was copied; stage it from global memory
        _stage_tile(a_k, b_k, glob, tables, tok0, head, st_l, PG1, H, D, NP)
        _stage_tile(a_v, b_v, glob, tables, tok0, H + head, st_l, PG1, H, D, NP)
        ttgl.thread_barrier()
    elif kind == CODED:  # raw blocks (a sixth of tiles hold none, on real KV) keep their code slot and patch
        if not PREPASSED:
            _prepass(b_k, m_k, b_v, m_v, pre_l, CW, HW, D, NP, True, LEAN)
    elif not PREPASSED:
        # Every path ends on a barrier of its own, the coded one at its pre-pass's end: the compiler then
        # puts none where they join (it cannot tell this slot from the one the next tile's copies fill,
        # and merges the paths' pending writes), one CTA barrier fewer a coded tile (7 -> 6, offline sm_90).
        ttgl.thread_barrier()
    raw = kind == RAW
    sel = (ttgl.where(raw, RAW_SEL[0], CODED_SEL[0]), ttgl.where(raw, RAW_SEL[1], CODED_SEL[1]))
    if _rank(mma) == 3:  # one page per warp: K [NP, D/2, 16], V [NP, 16, D/2]
        ka, kb = _operands(a_k, b_k, sel, OP_K, [NP, HALF, _PT], b_l)
        va, vb = _operands(a_v, b_v, sel, OP_V, [NP, _PT, HALF], b_l)
    else:
        ka, kb = _operands(a_k, b_k, sel, OP_K, [HALF, N], b_l)
        va, vb = _operands(a_v, b_v, sel, OP_V, [N, HALF], b_l)
    return ka, kb, va, vb
