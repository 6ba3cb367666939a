"""Triton kernels that write the heap: encode full pages, store tokens into raw pages
(kernels/format/layout.py).

The write side of the codec, split from the page reader (codec/restore.py) because the two share no kernel
code and each is long enough to read on its own; zipkv.kernels.codec.pages holds their checked wrappers.
Encode runs one program per page, walking its page-heads in page order, because a page-head's offset depends
on the sizes of every block before it in the page. Each page-head is read once (as int16 values), its blocks'
exponent ranges reduce to markers, and low bytes + codes (or the raw values) are written. Storing tokens
scatters each new token's K and V rows into its raw page. Integer-only: nothing here does bf16 math.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..format.layout import PAGE_TOKENS

_TOKENS = tl.constexpr(PAGE_TOKENS)  # globals reach a jitted function only as constexpr


# ---- encode -------------------------------------------------------------------------------------------


@triton.jit
def _encode_page_head(
    heap_i16, heap_u8, src, dst, written, meta_u8, meta_row,
    R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, META_BYTES: tl.constexpr, PAIRED: tl.constexpr,
):  # fmt: skip
    """Encode one raw page-head at byte ``src`` into the page at ``dst``, ``written`` bytes in."""
    ROWS: tl.constexpr = NB * R
    HALF: tl.constexpr = C // 2
    rows = tl.arange(0, ROWS)
    k = tl.arange(0, HALF)
    # A raw page-head holds its blocks back to back, each [R, C] row-major: row r starts at value r * C.
    # (src // 256) * 128 rather than src // 2: tells the compiler the 256-byte alignment, for wide loads.
    elem = (src // 256) * 128 + rows[:, None] * C + k[None, :]
    v_lo = tl.load(heap_i16 + elem)  # values (t, k), k < C/2
    v_hi = tl.load(heap_i16 + elem + HALF)  # values (t, k + C/2): they share a code byte with (t, k)
    x_lo = v_lo.to(tl.int32) & 0xFFFF
    x_hi = v_hi.to(tl.int32) & 0xFFFF
    e_lo = (x_lo >> 7) & 0xFF
    e_hi = (x_hi >> 7) & 0xFF
    row_min = tl.minimum(tl.min(e_lo, axis=1), tl.min(e_hi, axis=1))
    row_max = tl.maximum(tl.max(e_lo, axis=1), tl.max(e_hi, axis=1))
    base = (tl.min(tl.reshape(row_min, [NB, R]), axis=1) >> 1) << 1  # [NB]
    fits = (tl.max(tl.reshape(row_max, [NB, R]), axis=1) - base) < 16
    marker = tl.where(fits, base >> 1, 255)
    size = tl.where(fits, 768, 1024)
    start = written + tl.cumsum(size, axis=0) - size  # [NB] bytes from the page start

    # Metadata row: int32 LE offset of the first block, one marker per block, zero padding.
    mi = tl.arange(0, META_BYTES)
    jj = tl.arange(0, NB)
    mk = tl.sum(tl.where((mi[:, None] - 4) == jj[None, :], marker[None, :], 0), axis=1)
    ob = (written.to(tl.int32) >> (8 * (mi & 3))) & 0xFF
    tl.store(meta_u8 + meta_row * META_BYTES + mi, tl.where(mi < 4, ob, mk).to(tl.uint8))

    # Per-row copies of the block fields (rows of block j are j*R .. j*R+R-1).
    start_row = tl.reshape(tl.broadcast_to(start[:, None], [NB, R]), [ROWS])
    base_row = tl.reshape(tl.broadcast_to(base[:, None], [NB, R]), [ROWS])
    fits_row = tl.reshape(tl.broadcast_to(fits[:, None], [NB, R]), [ROWS])
    block = tl.multiple_of(dst + start_row, 256)  # every block starts on a 256-byte boundary
    rin = rows % R
    comp = fits_row[:, None]
    raw = (fits_row.to(tl.int32) == 0)[:, None]

    if PAIRED:  # format v2: the low bytes of (t, k) and (t, k + C/2) as one 16-bit word
        pair = (block // 2)[:, None] + rin[:, None] * HALF + k[None, :]
        tl.store(heap_i16 + pair, ((x_lo & 0xFF) | ((x_hi & 0xFF) << 8)).to(tl.int16), mask=comp)
    else:
        low = block[:, None] + rin[:, None] * C + k[None, :]
        tl.store(heap_u8 + low, x_lo.to(tl.uint8), mask=comp)
        tl.store(heap_u8 + low + HALF, x_hi.to(tl.uint8), mask=comp)
    d_lo = (e_lo - base_row[:, None]) >> 1
    d_hi = (e_hi - base_row[:, None]) >> 1
    code = ((x_lo >> 15) << 7) | ((x_hi >> 15) << 6) | (d_hi << 3) | d_lo
    tl.store(heap_u8 + block[:, None] + 512 + rin[:, None] * HALF + k[None, :], code.to(tl.uint8), mask=comp)

    raw_elem = (block // 2)[:, None] + rin[:, None] * C + k[None, :]
    tl.store(heap_i16 + raw_elem, v_lo, mask=raw)
    tl.store(heap_i16 + raw_elem + HALF, v_hi, mask=raw)
    return written + tl.sum(size, axis=0)


@triton.jit
def _encode_pages_kernel(
    heap_i16, heap_u8, src_offsets, dst_offsets, meta_u8, sizes_out, H, RAW_PAGE_HEAD_BYTES,
    KR: tl.constexpr, KC: tl.constexpr, VR: tl.constexpr, VC: tl.constexpr,
    NB: tl.constexpr, META_BYTES: tl.constexpr, PAIRED: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    src = tl.load(src_offsets + i)
    dst = tl.load(dst_offsets + i)
    written = tl.zeros([], dtype=tl.int64)
    for h in range(H):  # K page-heads, then V: page order
        written = _encode_page_head(
            heap_i16, heap_u8, src + h * RAW_PAGE_HEAD_BYTES, dst, written, meta_u8, i * 2 * H + h,
            KR, KC, NB, META_BYTES, PAIRED,
        )  # fmt: skip
    for h in range(H):
        written = _encode_page_head(
            heap_i16, heap_u8, src + (H + h) * RAW_PAGE_HEAD_BYTES, dst, written, meta_u8, i * 2 * H + H + h,
            VR, VC, NB, META_BYTES, PAIRED,
        )  # fmt: skip
    tl.store(sizes_out + i, written.to(tl.int32))


# ---- store tokens -------------------------------------------------------------------------------------


@triton.jit
def _store_head(heap_i16, src_row, dst_page_head, t, D: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    c = tl.arange(0, D)
    pos = ((t // R) * (D // C) + c // C) * 512 + (t % R) * C + c % C
    tl.store(heap_i16 + dst_page_head + pos, tl.load(src_row + c))


@triton.jit
def _store_tokens_kernel(
    heap_i16, page_loc, slots, k_i16, v_i16, H, k_token_stride, v_token_stride,
    D: tl.constexpr, KR: tl.constexpr, KC: tl.constexpr, VR: tl.constexpr, VC: tl.constexpr,
):  # fmt: skip
    # A token's k (and v) row is its H heads of D values one after another; rows may be apart by any
    # stride (k and v as views of the QKV projection's output: no copy before the store).
    n = tl.program_id(0).to(tl.int64)
    ph = tl.program_id(1)
    slot = tl.load(slots + n)
    t = slot % _TOKENS
    page_head = tl.load(page_loc + slot // _TOKENS) // 2 + ph * (_TOKENS * D)
    if ph < H:
        _store_head(heap_i16, k_i16 + n * k_token_stride + ph * D, page_head, t, D, KR, KC)
    else:
        _store_head(heap_i16, v_i16 + n * v_token_stride + (ph - H) * D, page_head, t, D, VR, VC)
