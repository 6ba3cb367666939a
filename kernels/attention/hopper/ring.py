"""The Hopper decode kernel's producer (kernels/attention/hopper/decode.py): for each tile of ``NP`` pages,
the page-table and metadata loads (issued one tile ahead of the copies they steer: they depend on each other,
and a tile that waited for them would stall), how the tile will be read, and its ``cp.async`` copies
into a ring slot.

A ring slot holds, per KV side (K and V), two buffers of ``[NP, D chunks, 16 bytes]`` (A and B, see
kernels/attention/hopper/layouts.py) and the tile's block markers ``[NP, D/8]``. What a page's bytes become
there depends on how it is stored (kernels/format/layout_v3.py): a coded page's lo plane goes to A, its code
plane and its raw blocks' patches to B; a raw page's channels ``< D/2`` to A and ``>= D/2`` to B. Each
16-byte chunk's source is picked so that the buffers come out swizzled for the consumer's ldmatrix.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.runtime.jit import constexpr_function

from ...format.layout import PAGE_TOKENS

NUM_WARPS = 4  # the default; a launch may ask for 1, 2 or 4 (the layouts below take the count it runs with)
_PT = ttgl.constexpr(PAGE_TOKENS)  # Gluon reads globals only as constexpr
# How a tile is read (kernels/attention/hopper/decode.py's docstring): every page coded (raw blocks among them
# take their patches), every page raw, gathered from global memory (a partial or mixed tile), or past the
# split.
CODED, RAW, GATHER, EMPTY = (ttgl.constexpr(k) for k in range(4))
KIND_BITS = ttgl.constexpr(3)


@constexpr_function
def copy_layout(NP, NW):  # type: ignore[no-untyped-def]
    """[NP, chunks, 16 bytes]: one 16-byte chunk per thread and copy; warps along pages. The same layout for
    every chunk count, so a page's pointer (its [NP] slice) serves the lo, code, patch and raw copies."""
    wp = min(NP, NW)
    return ttgl.BlockedLayout([1, 1, 16], [1, 32, 1], [wp, NW // wp, 1], [2, 1, 0])


@constexpr_function
def meta_layout(D, NP, NW):  # type: ignore[no-untyped-def]
    """[NP, D/8] block markers of a tile's K (or V) page-heads."""
    tp = min(NP, 32)
    return ttgl.BlockedLayout([1, D // 8], [tp, 32 // tp], [1, NW], [1, 0])


@constexpr_function
def every_thread_layout(NP, NW):  # type: ignore[no-untyped-def]
    """[NP] held whole by every thread: a tile's kind is then decided without a cross-warp reduction."""
    return ttgl.BlockedLayout([NP], [32], [NW], [0])


@gluon.jit
def _swz(t, D: ttgl.constexpr):
    """views.swizzle_chunk: XOR of the 16-byte chunk index of lo-plane row t."""
    CH: ttgl.constexpr = D // 16
    RPL: ttgl.constexpr = 8 // CH if CH < 8 else 1
    MOD: ttgl.constexpr = CH if CH < 8 else 8
    swz = (t // RPL) % MOD
    if CH >= 8:
        swz = swz ^ ((t // 8) % 2 * 2)
    return swz


@gluon.jit
def _chunks(C: ttgl.constexpr, cp_l: ttgl.constexpr):
    """(chunk index [1, C, 1], byte in chunk [1, 1, 16]) in the copy layout."""
    c = ttgl.arange(0, C, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, cp_l)))[None, :, None]
    b = ttgl.arange(0, 16, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, cp_l)))[None, None, :]
    return c, b


@gluon.jit
def _copy_lo(dst, page_ptr, ph, cp_l: ttgl.constexpr, D: ttgl.constexpr):
    """A [NP, D chunks, 16 B] <- a coded page-head's lo plane [16][D/2] u16, swizzled for ldmatrix.
    The offsets depend on the thread only: computed once, outside the loop."""
    c, b = _chunks(D, cp_l)
    t = c // (D // 16)
    off = ph * (24 * D) + t * D + ((c % (D // 16)) ^ _swz(t, D)) * 16
    src = ttgl.multiple_of(page_ptr[:, None, None] + off, [16, 16, 16])  # pages: 64-byte aligned
    async_copy.async_copy_global_to_shared(dst, src + b)


@gluon.jit
def _copy_b(dst, page_ptr, ph, marks, cp_l: ttgl.constexpr, H: ttgl.constexpr, D: ttgl.constexpr):
    """B [NP, D chunks, 16 B] <- a coded page-head's code plane (chunks < D/2, the format's order) and its
    raw blocks' patches (block G's at chunks D/2 + 4G .. +3; nothing for coded blocks). ``marks``: int32
    [NP, D], the marker of each patch chunk's block. One copy for both halves: two copies into one buffer
    would cost a CTA barrier (the compiler orders writes to one buffer)."""
    c, b = _chunks(D, cp_l)
    m3 = marks[:, :, None]
    patch = c >= D // 2
    code_off = ph * (24 * D) + 16 * D + c * 16
    patch_off = 2 * H * (24 * D) + (m3 & 0x7F) * 64 + (c % 4) * 16
    src = ttgl.multiple_of(page_ptr[:, None, None] + ttgl.where(patch, patch_off, code_off), [16, 16, 16])
    async_copy.async_copy_global_to_shared(dst, src + b, mask=~patch | (m3 >= 0x80))


@gluon.jit
def _opaque(x):
    """``x``, hidden from LLVM's constant folding: it would pull the constant part of an offset out of the
    32-bit add into a second 64-bit add of the address (a copy's immediate cannot hold it), two more
    instructions per copy and tile; computed once, outside the loop."""
    return ttgl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=ttgl.int32, is_pure=True, pack=1)


@gluon.jit
def _copy_coded_lean(a_k, b_k, a_v, b_v, page_ptr, ph, mk, mv, cp_l: ttgl.constexpr, H: ttgl.constexpr,
                     D: ttgl.constexpr):  # fmt: skip
    """:func:`_copy_lo` and :func:`_copy_b` of K (page-head ``ph``) and V (``H + ph``), addressed for fewer
    instructions (decode.py's LEAN): V's sources are K's plus H * 24 D bytes (a cp.async source immediate
    holds only -2048..2047 bytes on sm_90, so beyond one KV head at head_dim 64 ptxas still adds it per
    chunk, two instructions each); a patch chunk's offset is one multiply-add of its raw
    block's marker (0x80 + patch index: (m - 0x80) * 64 = m * 64 - 0x2000; a coded block's chunk is masked
    off, its address never read)."""
    c, b = _chunks(D, cp_l)
    t = c // (D // 16)
    lo = ph * (24 * D) + t * D + ((c % (D // 16)) ^ _swz(t, D)) * 16
    lo_k = ttgl.multiple_of(page_ptr[:, None, None] + lo, [16, 16, 16])
    async_copy.async_copy_global_to_shared(a_k, lo_k + b)
    async_copy.async_copy_global_to_shared(a_v, lo_k + (H * 24 * D) + b)
    patch = c >= D // 2
    code_k = page_ptr[:, None, None] + (ph * (24 * D) + 16 * D) + c * 16
    base = _opaque(2 * H * (24 * D) - 0x80 * 64 + (c % 4) * 16)
    mk3 = mk[:, :, None]
    mv3 = mv[:, :, None]
    src_k = ttgl.where(patch, page_ptr[:, None, None] + (mk3 * 64 + base), code_k)
    src_v = ttgl.where(patch, page_ptr[:, None, None] + (mv3 * 64 + base), code_k + H * (24 * D))
    async_copy.async_copy_global_to_shared(
        b_k, ttgl.multiple_of(src_k, [16, 16, 16]) + b, mask=~patch | (mk3 >= 0x80)
    )
    async_copy.async_copy_global_to_shared(
        b_v, ttgl.multiple_of(src_v, [16, 16, 16]) + b, mask=~patch | (mv3 >= 0x80)
    )


@gluon.jit
def _copy_raw(a_dst, b_dst, page_ptr, ph, cp_l: ttgl.constexpr, D: ttgl.constexpr):
    """A, B [NP, D chunks, 16 B] <- a raw page-head's channels < D/2 and >= D/2, swizzled as the lo plane."""
    c, b = _chunks(D, cp_l)
    t = c // (D // 16)
    off = ph * (32 * D) + t * (2 * D) + ((c % (D // 16)) ^ _swz(t, D)) * 16
    src = ttgl.multiple_of(page_ptr[:, None, None] + off, [16, 16, 16])
    async_copy.async_copy_global_to_shared(a_dst, src + b)
    async_copy.async_copy_global_to_shared(b_dst, src + D + b)


@gluon.jit
def _patch_marks(meta_ptr, pid, ph, mk_l: ttgl.constexpr, H: ttgl.constexpr, D: ttgl.constexpr):
    """int32 [NP, D]: the marker of the block whose patch B's chunk c >= D/2 receives (0 elsewhere)."""
    c = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, mk_l))[None, :]
    row = pid.to(ttgl.int64)[:, None] * (2 * H * (D // 8)) + ph * (D // 8)
    return ttgl.load(meta_ptr + row + (c - D // 2) // 4, mask=c >= D // 2, other=0).to(ttgl.int32)


@gluon.jit
def _spread(pid_e, k, NP: ttgl.constexpr):
    """``pid_e``'s entries (every thread holds all NP) at indices ``k`` of another layout: each entry taken
    out by a sum inside the thread (no shuffle, no shared memory) and selected, not loaded again."""
    ke = ttgl.arange(0, NP, layout=every_thread_layout(NP, ttgl.num_warps()))
    out = ttgl.zeros_like(k)
    for i in ttgl.static_range(NP):
        out = ttgl.where(k == i, ttgl.sum(ttgl.where(ke == i, pid_e, 0), axis=0), out)
    return out


@gluon.jit
def tile_ids(tables, tok0, D: ttgl.constexpr, NP: ttgl.constexpr):
    """A tile's page ids, issued two tiles ahead of its copies (the loads of :func:`tile_info` need them):
    every page's (held by every thread), the thread's own page's, and the metadata copy's. Up to two pages a
    tile, one load and the other two layouts select from it: 17 fewer SASS instructions a coded tile at
    head_dim 128 (587 against 604, offline sm_90, docs/benchmarks.md). At four pages the selects hold more
    registers than the loads (head_dim 64 then spilled in the loop), so each layout loads its own."""
    page_ids_ptr, _, _, page_base, end, _ = tables
    first_page = page_ids_ptr + page_base + tok0 // _PT
    ke = ttgl.arange(0, NP, layout=every_thread_layout(NP, ttgl.num_warps()))
    pid_e = ttgl.load(first_page + ke, mask=tok0 + ke * _PT < end, other=0)
    kp = ttgl.arange(
        0, NP, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, copy_layout(NP, ttgl.num_warps())))
    )
    km = ttgl.arange(0, NP, layout=ttgl.SliceLayout(1, meta_layout(D, NP, ttgl.num_warps())))
    if NP <= 2:
        pid_p = _spread(pid_e, kp, NP)
        pid_m = _spread(pid_e, km, NP)
    else:
        pid_p = ttgl.load(first_page + kp, mask=tok0 + kp * _PT < end, other=0)
        pid_m = ttgl.load(first_page + km, mask=tok0 + km * _PT < end, other=0)
    return pid_e, pid_p, pid_m


@gluon.jit
def tile_info(tables, tok0, ids, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr):
    """The loads a tile's copies need, issued one tile ahead of them (``ids``: :func:`tile_ids`'s, loaded a
    tile earlier): every page's validity and raw flag (held by every thread), the byte offset of the
    thread's page, the patch markers of its K and V page-heads, and the page ids the metadata copy reads.
    ``tables``: (page_ids_ptr, page_loc_ptr, meta_ptr, page_base, end, head) of the program's request and
    KV head."""
    _, page_loc_ptr, meta_ptr, _, end, head = tables
    pid_e, pid_p, pid_m = ids
    cp_l: ttgl.constexpr = copy_layout(NP, ttgl.num_warps())
    pg_l: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(2, cp_l))
    mk_l: ttgl.constexpr = ttgl.SliceLayout(2, cp_l)
    # Every page's raw flag, in every thread (a raw page's markers are all 0xFF).
    ke = ttgl.arange(0, NP, layout=every_thread_layout(NP, ttgl.num_warps()))
    valid_e = tok0 + ke * _PT < end
    row_e = pid_e.to(ttgl.int64) * (2 * H * (D // 8)) + head * (D // 8)
    raw_e = ttgl.load(meta_ptr + row_e, mask=valid_e, other=0).to(ttgl.int32) == 0xFF
    # The thread's own page (copies), masked past the end (such a tile is gathered, not copied).
    kp = ttgl.arange(0, NP, layout=pg_l)
    loc = ttgl.load(page_loc_ptr + pid_p, mask=tok0 + kp * _PT < end, other=0)
    mk = _patch_marks(meta_ptr, pid_p, head, mk_l, H, D)
    mv = _patch_marks(meta_ptr, pid_p, H + head, mk_l, H, D)
    return valid_e, raw_e, loc, mk, mv, pid_m.to(ttgl.int64)


@gluon.jit
def _tile_kind(valid, raw, tok0, end, NP: ttgl.constexpr):
    """CODED / RAW / GATHER / EMPTY for a tile from its pages' (valid, raw), held by every thread."""
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
def issue_tile(slot, heap_ptr, tables, tok0, info, H: ttgl.constexpr, D: ttgl.constexpr, NP: ttgl.constexpr,
               GATHER_ALL: ttgl.constexpr, LEAN: ttgl.constexpr = False):  # fmt: skip
    """Start one tile's copies into its ring ``slot`` (a_k, b_k, a_v, b_v, m_k, m_v; the caller commits
    the group) from ``info`` (:func:`tile_info`'s); returns how the tile will be read. Each way copies only
    what it reads (full tiles only, so no masks but the patches'). GATHER_ALL (a test mode) gathers every
    tile: the three ways must give the same bits."""
    a_k, b_k, a_v, b_v, m_k, m_v = slot
    _, _, meta_ptr, _, end, head = tables
    valid_e, raw_e, loc, mk, mv, pm = info
    cp_l: ttgl.constexpr = copy_layout(NP, ttgl.num_warps())
    mt_l: ttgl.constexpr = meta_layout(D, NP, ttgl.num_warps())
    kind = _tile_kind(valid_e, raw_e, tok0, end, NP)
    if GATHER_ALL and kind != EMPTY:
        kind = GATHER
    page_ptr = heap_ptr + loc
    if kind == CODED:
        if LEAN:
            _copy_coded_lean(a_k, b_k, a_v, b_v, page_ptr, head, mk, mv, cp_l, H, D)
        else:
            _copy_lo(a_k, page_ptr, head, cp_l, D)
            _copy_lo(a_v, page_ptr, H + head, cp_l, D)
            _copy_b(b_k, page_ptr, head, mk, cp_l, H, D)
            _copy_b(b_v, page_ptr, H + head, mv, cp_l, H, D)
        b = ttgl.arange(0, D // 8, layout=ttgl.SliceLayout(0, mt_l))[None, :]
        row = pm[:, None] * (2 * H * (D // 8)) + b
        async_copy.async_copy_global_to_shared(m_k, meta_ptr + row + head * (D // 8))
        async_copy.async_copy_global_to_shared(m_v, meta_ptr + row + (H + head) * (D // 8))
    elif kind == RAW:
        _copy_raw(a_k, b_k, page_ptr, head, cp_l, D)
        _copy_raw(a_v, b_v, page_ptr, H + head, cp_l, D)
    return kind
