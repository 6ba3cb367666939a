"""Triton kernels of page format v3 (kernels/format/layout_v3.py): encode full pages, restore pages.

zipkv.kernels.codec.pages holds their checked wrappers and picks them by ``fmt.version``; the torch twins are
kernels/reference/pages_v3.py's heap functions, tested against these bit for bit (compiled on the GPU, under
``TRITON_INTERPRET=1`` on the CPU). Integer-only: nothing here does bf16 math.

Every tile is a page-head's 16 tokens x D/2 pairs ``(t, p)``, the two values of a pair being channels
``p`` and ``p + D/2``: raw rows and the lo plane are read and written as whole rows (16-byte vectors),
and a block's 64 code (or patch) bytes, ``[16 tokens][4 pairs]`` in K and V alike, go through one
reshape + permute between the tile's ``(t, p)`` order and the block's, so the code plane and patches
also move as contiguous vectors.

Encode: one program per page, walking its page-heads in page order, because a raw block's patch rank is
its prefix count among the page's raw blocks. Each page-head is read once; once the page has more raw
blocks than a page can patch, the rest is neither read nor written, and a page that ends up stored raw
(too many raw blocks, or all raw) is copied over what was written (after a barrier, so every thread's
earlier stores are ordered before the copy's). Decode: one program per page-head (or per ``G``
page-heads), raw pages copied, coded page-heads restored from the lo plane, codes, ``b/2`` and patches.

Alignment: page offsets must be multiples of 16 bytes (the kernels read and write 16-byte vectors; v3
pages are multiples of 64 bytes, and the allocator places them on 64-byte units).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..format import layout_v3 as v3

_MAX_PATCHES = tl.constexpr(v3.MAX_PATCHES)  # globals reach a jitted function only as constexpr
_RAW_BLOCK_FLAG = tl.constexpr(v3.RAW_BLOCK_FLAG)
_RAW_PAGE_MARKER = tl.constexpr(v3.RAW_PAGE_MARKER)
_SPAN = tl.constexpr(v3.EXPONENT_SPAN)
_ORDER_OK = v3.pair_of(1, 2) == 6 and v3.code_byte_index(3, 6, 64) == v3.lo_plane_bytes(64) + 64 + 4 * 3 + 2
if v3.BLOCK_TOKENS != 16 or v3.BLOCK_PAIRS != 4 or not _ORDER_OK:
    raise ImportError(
        "codec_v3's block byte order (the permutes below) no longer matches format/layout_v3.py"
    )


@triton.jit
def _to_block_order(x, D: tl.constexpr):
    """[16, D/2] tile (token t, pair p) -> [D/8, 64]: block G = p // 4 holds (t, j = p % 4) at byte 4t + j."""
    return tl.reshape(tl.permute(tl.reshape(x, [16, D // 8, 4]), (1, 0, 2)), [D // 8, 64])


@triton.jit
def _from_block_order(y, D: tl.constexpr):
    """Inverse of :func:`_to_block_order`: [D/8, 64] -> [16, D/2]."""
    return tl.reshape(tl.permute(tl.reshape(y, [D // 8, 16, 4]), (1, 0, 2)), [16, D // 2])


@triton.jit
def _per_pair(x, D: tl.constexpr):
    """[D/8] per block -> [1, D/2] per pair (pairs 4G .. 4G + 3 are block G)."""
    return tl.reshape(tl.broadcast_to(x[:, None], [D // 8, 4]), [1, D // 2])


# ---- encode -------------------------------------------------------------------------------------------


@triton.jit
def _encode_page_head(
    heap_i16, heap_u8, src_e, dst, ph, meta_row, meta_u8, raw_count, records_bytes,
    D: tl.constexpr,
):  # fmt: skip
    """Code page-head ``ph`` of the raw page at int16 index ``src_e`` into the page at byte ``dst``, its
    raw blocks ranked after the page's ``raw_count`` so far; returns the new count."""
    HALF: tl.constexpr = D // 2
    NB: tl.constexpr = D // 8
    # past MAX_PATCHES raw blocks the page is stored raw: skip the rest (masks built by comparing tiles,
    # as the interpreter takes no mask combined from a scalar)
    active = (raw_count <= _MAX_PATCHES).to(tl.int32)
    t = tl.arange(0, 16)[:, None]
    p = tl.arange(0, HALF)[None, :]
    on_rows = (t * 0 + p * 0 + active) != 0
    elem = src_e + ph * (16 * D) + t * D + p
    x_lo = tl.load(heap_i16 + elem, mask=on_rows, other=0).to(tl.int32) & 0xFFFF  # channel p
    x_hi = tl.load(heap_i16 + elem + HALF, mask=on_rows, other=0).to(tl.int32) & 0xFFFF  # channel p + D/2
    e_lo = (x_lo >> 7) & 0xFF
    e_hi = (x_hi >> 7) & 0xFF
    e_min = tl.minimum(
        tl.min(tl.reshape(e_lo, [16, NB, 4]), axis=2), tl.min(tl.reshape(e_hi, [16, NB, 4]), axis=2)
    )
    e_max = tl.maximum(
        tl.max(tl.reshape(e_lo, [16, NB, 4]), axis=2), tl.max(tl.reshape(e_hi, [16, NB, 4]), axis=2)
    )
    base = (tl.min(e_min, axis=0) >> 1) << 1  # [NB]
    coded = (tl.max(e_max, axis=0) - base) < _SPAN
    raw = tl.where(coded, 0, 1)
    rank = raw_count + tl.cumsum(raw, axis=0) - raw
    blocks = tl.arange(0, NB)
    marker = tl.where(coded, base >> 1, _RAW_BLOCK_FLAG | rank)
    tl.store(meta_u8 + meta_row * NB + blocks, marker.to(tl.uint8), mask=(blocks * 0 + active) != 0)

    record = dst + ph * (24 * D)
    lo = (x_lo & 0xFF) | ((x_hi & 0xFF) << 8)
    tl.store(heap_i16 + record // 2 + t * HALF + p, lo.to(tl.int16), mask=on_rows)
    base_p = _per_pair(base, D)
    code = ((x_lo >> 15) << 7) | ((x_hi >> 15) << 6) | (((e_hi - base_p) >> 1) << 3) | ((e_lo - base_p) >> 1)
    code = tl.where(_per_pair(coded, D), code, x_lo >> 8)  # a raw block keeps channel p's high bytes here
    b = tl.arange(0, 64)[None, :]
    code_at = record + 16 * D + blocks[:, None] * 64 + b
    tl.store(heap_u8 + code_at, _to_block_order(code, D).to(tl.uint8), mask=(code_at * 0 + active) != 0)
    patch_at = dst + records_bytes + rank[:, None] * 64 + b  # ... and channel p + D/2's in its patch
    patch = _to_block_order(x_hi >> 8, D).to(tl.uint8)
    tl.store(heap_u8 + patch_at, patch, mask=(raw[:, None] * active + b * 0) != 0)
    return raw_count + tl.sum(raw, axis=0) * active


@triton.jit
def _encode_pages_v3_kernel(
    heap_i16, heap_u8, src_offsets, dst_offsets, meta_u8, sizes_out, H, D: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    # (x // 16) * 16 rather than x: tells the compiler the 16-byte alignment, for vector loads and stores
    src_e = (tl.load(src_offsets + i) // 16) * 8  # int16 index
    dst = (tl.load(dst_offsets + i) // 16) * 16
    records_bytes = 2 * H * (24 * D)
    raw_count = tl.zeros([], dtype=tl.int32)
    for ph in range(2 * H):  # K page-heads, then V (coded alike): page order
        raw_count = _encode_page_head(
            heap_i16, heap_u8, src_e, dst, ph, i * 2 * H + ph, meta_u8, raw_count, records_bytes, D
        )
    stored_raw = (raw_count > _MAX_PATCHES) | (raw_count >= 2 * H * (D // 8))
    tl.store(sizes_out + i, tl.where(stored_raw, 2 * H * 32 * D, records_bytes + 64 * raw_count))
    if stored_raw:  # plain [2, H, 16, D] bf16 over what the page-heads wrote, and 0xFF metadata
        tl.debug_barrier()
        row = tl.arange(0, 16 * D)
        for ph in range(2 * H):
            tl.store(
                heap_i16 + dst // 2 + ph * (16 * D) + row, tl.load(heap_i16 + src_e + ph * (16 * D) + row)
            )
            marker = tl.full([D // 8], _RAW_PAGE_MARKER, dtype=tl.uint8)
            tl.store(meta_u8 + (i * 2 * H + ph) * (D // 8) + tl.arange(0, D // 8), marker)


# ---- decode -------------------------------------------------------------------------------------------


@triton.jit
def _store_rows(ptr, x, STREAM: tl.constexpr):
    if STREAM:  # the restored pages are read once, by someone else: do not keep them in L2
        tl.store(ptr, x, cache_modifier=".cs")
    else:
        tl.store(ptr, x)


@triton.jit
def _decode_page_head(
    heap_u8, heap_i16, page, ph, meta_row, meta_u8, out_i16, records_bytes,
    D: tl.constexpr, STREAM: tl.constexpr,
):  # fmt: skip
    """Restore page-head ``ph`` (metadata row ``meta_row``, also its output row) of the page at ``page``."""
    HALF: tl.constexpr = D // 2
    NB: tl.constexpr = D // 8
    blocks = tl.arange(0, NB)
    marker = tl.load(meta_u8 + meta_row * NB + blocks).to(tl.int32)
    t = tl.arange(0, 16)[:, None]
    out_row = out_i16 + meta_row * (16 * D) + t * D
    if tl.min(marker, axis=0) == _RAW_PAGE_MARKER:  # a raw page: plain rows
        c = tl.arange(0, D)[None, :]
        _store_rows(out_row + c, tl.load(heap_i16 + page // 2 + ph * (16 * D) + t * D + c), STREAM)
    else:
        p = tl.arange(0, HALF)[None, :]
        b = tl.arange(0, 64)[None, :]
        record = page + ph * (24 * D)
        lo = tl.load(heap_i16 + record // 2 + t * HALF + p).to(tl.int32)
        codes = tl.load(heap_u8 + record + 16 * D + blocks[:, None] * 64 + b)
        raw = marker >= _RAW_BLOCK_FLAG
        patch_at = page + records_bytes + (marker & 0x7F)[:, None] * 64 + b
        patches = tl.load(heap_u8 + patch_at, mask=raw[:, None], other=0)
        code = _from_block_order(codes.to(tl.int32), D)
        patch = _from_block_order(patches.to(tl.int32), D)
        half_base = _per_pair(tl.where(raw, 0, marker), D)
        raw_p = _per_pair(raw, D)
        high_p = tl.where(raw_p, code, (code & 0x80) | (half_base + (code & 7)))
        high_q = tl.where(raw_p, patch, ((code & 0x40) << 1) | (half_base + ((code >> 3) & 7)))
        _store_rows(out_row + p, ((high_p << 8) | (lo & 0xFF)).to(tl.int16), STREAM)
        _store_rows(out_row + HALF + p, ((high_q << 8) | ((lo >> 8) & 0xFF)).to(tl.int16), STREAM)


@triton.jit
def _decode_pages_v3_kernel(
    heap_u8, heap_i16, offsets, meta_u8, out_i16, H,
    D: tl.constexpr, G: tl.constexpr, STREAM: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    ph0 = tl.program_id(1) * G
    page = (tl.load(offsets + i) // 16) * 16  # tells the compiler the 16-byte alignment
    records_bytes = 2 * H * (24 * D)
    for g in tl.static_range(G):
        ph = ph0 + g
        _decode_page_head(
            heap_u8, heap_i16, page, ph, i * 2 * H + ph, meta_u8, out_i16, records_bytes, D, STREAM
        )
