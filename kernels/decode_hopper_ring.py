"""The Hopper decode kernel's producer (kernels/decode_hopper.py): for each tile of ``NP`` pages, the
page-table and metadata loads (issued one tile ahead of the copies they steer: they depend on each other,
and a tile that waited for them would stall), how the tile will be read, and its ``cp.async`` copies
into a ring slot.

A ring slot holds, per KV side (K and V), two buffers of ``[NP, D chunks, 16 bytes]`` (A and B, see
kernels/decode_hopper_layouts.py) and the tile's block markers ``[NP, D/8]``. What a page's bytes become
there depends on how it is stored (kernels/layout_v3.py): a coded page's lo plane goes to A, its code
plane and its raw blocks' patches to B; a raw page's channels ``< D/2`` to A and ``>= D/2`` to B. Each
16-byte chunk's source is picked so that the buffers come out swizzled for the consumer's ldmatrix.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.runtime.jit import constexpr_function

from .layout import PAGE_TOKENS

NUM_WARPS = 4
_NW = ttgl.constexpr(NUM_WARPS)
_PT = ttgl.constexpr(PAGE_TOKENS)  # Gluon reads globals only as constexpr
# How a tile is read (kernels/decode_hopper.py's docstring): every page coded (PATCHED: with raw blocks
# among them), every page raw, gathered from global memory (a partial or mixed tile), or past the split.
CODED, RAW, GATHER, EMPTY, PATCHED = (ttgl.constexpr(k) for k in range(5))
KIND_BITS = ttgl.constexpr(3)


@constexpr_function
def copy_layout(NP):  # type: ignore[no-untyped-def]
    """[NP, chunks, 16 bytes]: one 16-byte chunk per thread and copy; warps along pages."""
    wp = min(NP, NUM_WARPS)
    return ttgl.BlockedLayout([1, 1, 16], [1, 32, 1], [wp, NUM_WARPS // wp, 1], [2, 1, 0])


@constexpr_function
def meta_layout(D, NP):  # type: ignore[no-untyped-def]
    """[NP, D/8] block markers of a tile's K (or V) page-heads."""
    return ttgl.BlockedLayout([1, D // 8], [NP, 32 // NP], [1, NUM_WARPS], [1, 0])


@gluon.jit
def _swz(t, D: ttgl.constexpr):
    """views.swizzle_chunk: XOR of the 16-byte chunk index of lo-plane row t."""
    CH: ttgl.constexpr = D // 16
    RPL: ttgl.constexpr = 8 // CH if CH < 8 else 1
    MOD: ttgl.constexpr = CH if CH < 8 else 8
    return (t // RPL) % MOD


@gluon.jit
def _page_info(
    page_ids_ptr,
    page_loc_ptr,
    meta_ptr,
    page_base,
    tok0,
    end,
    head,
    pg_layout: ttgl.constexpr,
    H: ttgl.constexpr,
    D: ttgl.constexpr,
    NP: ttgl.constexpr,
):
    """(valid, page id, byte offset, stored raw) of the tile's NP pages, int32/int64 [NP] in ``pg_layout``."""
    k = ttgl.arange(0, NP, layout=pg_layout)
    valid = tok0 + k * _PT < end
    pid = ttgl.load(page_ids_ptr + page_base + tok0 // _PT + k, mask=valid, other=0)
    loc = ttgl.load(page_loc_ptr + pid, mask=valid, other=0)
    row = pid.to(ttgl.int64) * (2 * H * (D // 8)) + head * (D // 8)
    raw = ttgl.load(meta_ptr + row, mask=valid, other=0).to(ttgl.int32) == 0xFF
    return valid, pid, loc, raw


@gluon.jit
def _tile_kind(valid, raw, tok0, end, NP: ttgl.constexpr):
    """CODED / RAW / GATHER / EMPTY for a tile from its pages' (valid, raw)."""
    n_raw = ttgl.sum((raw & valid).to(ttgl.int32), axis=0)
    full = tok0 + NP * _PT <= end
    kind = GATHER
    if tok0 >= end:
        kind = EMPTY
    elif full and n_raw == 0:
        kind = CODED
    elif full and n_raw == NP:
        kind = RAW
    return kind


@gluon.jit
def _copy_a(
    dst, page_ptr, raw, go, ph, cp_a: ttgl.constexpr, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr
):
    """Buffer A [NP, D chunks, 16 B]: a coded page's lo plane or a raw page's channels < D/2, swizzled.
    ``page_ptr``: [NP] pointers to the pages (offsets inside a page fit 32 bits)."""
    c = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, cp_a)))[None, :, None]
    b = ttgl.arange(0, 16, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, cp_a)))[None, None, :]
    t = c // (D // 16)
    ch = (c % (D // 16)) ^ _swz(t, D)
    off = ttgl.where(raw[:, None, None], ph * (32 * D) + t * (2 * D), ph * (24 * D) + t * D) + ch * 16
    src = ttgl.multiple_of(page_ptr[:, None, None] + off, [16, 16, 16])  # pages: 64-byte aligned
    async_copy.async_copy_global_to_shared(dst, src + b, mask=go[:, None, None])


@gluon.jit
def _copy_b(
    dst,
    page_ptr,
    raw,
    go,
    ph,
    marks,
    cp_a: ttgl.constexpr,
    H: ttgl.constexpr,
    D: ttgl.constexpr,
    NP: ttgl.constexpr,
):
    """Buffer B [NP, D chunks, 16 B]: a coded page's code plane (chunks < D/2) and its raw blocks' patches
    (block G at chunk D/2 + 4G), or a raw page's channels >= D/2, swizzled. ``marks``: int32 [NP, D] the
    marker of each chunk's block."""
    c = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, cp_a)))[None, :, None]
    b = ttgl.arange(0, 16, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, cp_a)))[None, None, :]
    t = c // (D // 16)
    raw_off = ph * (32 * D) + t * (2 * D) + D + ((c % (D // 16)) ^ _swz(t, D)) * 16
    raw3 = raw[:, None, None]
    m3 = marks[:, :, None]
    patch = c >= D // 2
    code_off = ph * (24 * D) + 16 * D + c * 16
    patch_off = 2 * H * (24 * D) + (m3 & 0x7F) * 64 + (c % 4) * 16
    off = ttgl.where(raw3, raw_off, ttgl.where(patch, patch_off, code_off))
    src = ttgl.multiple_of(page_ptr[:, None, None] + off, [16, 16, 16])
    need = raw3 | ~patch | ((m3 >= 0x80) & (m3 != 0xFF))
    async_copy.async_copy_global_to_shared(dst, src + b, mask=go[:, None, None] & need)


@gluon.jit
def _block_marks(
    meta_ptr, pid, valid, ph, mk_l: ttgl.constexpr, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr
):
    """int32 [NP, D]: the marker of the block whose patch B's chunk c >= D/2 receives (0 elsewhere)."""
    c = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, mk_l))[None, :]
    row = pid.to(ttgl.int64)[:, None] * (2 * H * (D // 8)) + ph * (D // 8)
    mask = valid[:, None] & (c >= D // 2)
    return ttgl.load(meta_ptr + row + (c - D // 2) // 4, mask=mask, other=0).to(ttgl.int32)


@gluon.jit
def tile_info(tables, tok0, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr):
    """The loads a tile's copies need, issued one tile ahead of them: per page its validity, byte offset,
    raw flag, block markers (K and V) and page id. ``tables``: (page_ids_ptr, page_loc_ptr, meta_ptr,
    page_base, end, head) of the program's request and KV head."""
    page_ids_ptr, page_loc_ptr, meta_ptr, page_base, end, head = tables
    cp_l: ttgl.constexpr = copy_layout(NP)
    mt_l: ttgl.constexpr = meta_layout(D, NP)
    pg_l: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(2, cp_l))
    mk_l: ttgl.constexpr = ttgl.SliceLayout(2, cp_l)
    valid, pid, loc, raw = _page_info(
        page_ids_ptr, page_loc_ptr, meta_ptr, page_base, tok0, end, head, pg_l, H, D, NP
    )
    mk = _block_marks(meta_ptr, pid, valid, head, mk_l, H, D, NP)
    mv = _block_marks(meta_ptr, pid, valid, H + head, mk_l, H, D, NP)
    k = ttgl.arange(0, NP, layout=ttgl.SliceLayout(1, mt_l))
    pm = ttgl.load(page_ids_ptr + page_base + tok0 // _PT + k, mask=tok0 + k * _PT < end, other=0)
    return valid, loc, raw, mk, mv, pm.to(ttgl.int64)


@gluon.jit
def issue_tile(slot, heap_ptr, tables, tok0, info, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
               GATHER_ALL: ttgl.constexpr):  # fmt: skip
    """Start one tile's copies into its ring ``slot`` (a_k, b_k, a_v, b_v, m_k, m_v; the caller commits
    the group) from ``info`` (:func:`tile_info`'s); returns how the tile will be read. GATHER_ALL (a test
    mode) gathers every tile: the three ways must give the same bits."""
    a_k, b_k, a_v, b_v, m_k, m_v = slot
    _, _, meta_ptr, _, end, head = tables
    valid, loc, raw, mk, mv, pm = info
    cp_l: ttgl.constexpr = copy_layout(NP)
    mt_l: ttgl.constexpr = meta_layout(D, NP)
    kind = _tile_kind(valid, raw, tok0, end, NP)
    if GATHER_ALL and kind != EMPTY:
        kind = GATHER
    if kind == CODED:  # raw blocks in the tile: the pre-pass must take their patches
        n_raw_blocks = ttgl.sum(ttgl.sum(((mk >= 0x80) | (mv >= 0x80)).to(ttgl.int32), axis=1), axis=0)
        if n_raw_blocks > 0:
            kind = PATCHED
    go = valid & ((kind == CODED) | (kind == PATCHED) | (kind == RAW))
    page_ptr = heap_ptr + loc
    _copy_a(a_k, page_ptr, raw, go, head, cp_l, H, D, NP)
    _copy_a(a_v, page_ptr, raw, go, H + head, cp_l, H, D, NP)
    _copy_b(b_k, page_ptr, raw, go, head, mk, cp_l, H, D, NP)
    _copy_b(b_v, page_ptr, raw, go, H + head, mv, cp_l, H, D, NP)
    k = ttgl.arange(0, NP, layout=ttgl.SliceLayout(1, mt_l))
    b = ttgl.arange(0, D // 8, layout=ttgl.SliceLayout(0, mt_l))[None, :]
    row = pm[:, None] * (2 * H * (D // 8)) + b
    gm = ((tok0 + k * _PT < end) & ((kind == CODED) | (kind == PATCHED)))[:, None]
    async_copy.async_copy_global_to_shared(m_k, meta_ptr + row + head * (D // 8), mask=gm)
    async_copy.async_copy_global_to_shared(m_v, meta_ptr + row + (H + head) * (D // 8), mask=gm)
    return kind
