"""Triton codec for the zipkv page format (kernels/layout.py): encode full pages, decode pages, store tokens.

Each kernel has a plain-torch twin in kernels/reference.py and is tested against it bit for bit, compiled on
the GPU and under ``TRITON_INTERPRET=1`` on the CPU. Every block geometry of layout.py is handled by index
arithmetic (the K and V geometries are constexpr). The codec is integer-only: nothing here does bf16 math.

- encode: one program per page, walking its page-heads in page order, because a page-head's offset depends
  on the sizes of every block before it in the page. Each page-head is read once (as int16 values), its
  blocks' exponent ranges reduce to markers, and low bytes + codes (or the raw values) are written.
- decode: one program per page-head by default, or per group of page-heads (their offsets are in the
  metadata; on the H200 the grouping, warps and interleave change the time by under 3%, see
  docs/benchmarks.md). Compressed blocks are restored a 32-bit word at a time (DESIGN.md section 4):
  four high bytes from one code word with a mask, one add of ``b/2`` in every byte and an OR of the signs,
  then high and low bytes are interleaved into bf16 pairs (PTX ``prmt`` on the GPU; shifts and masks under
  the interpreter, which cannot run inline assembly).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .layout import PAGE_TOKENS, PageFormat

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_TOKENS = tl.constexpr(PAGE_TOKENS)  # globals reach a jitted function only as constexpr


# ---- encode -------------------------------------------------------------------------------------------


@triton.jit
def _encode_page_head(
    heap_i16, heap_u8, src, dst, written, meta_u8, meta_row,
    R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, META_BYTES: tl.constexpr,
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
    NB: tl.constexpr, META_BYTES: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    src = tl.load(src_offsets + i)
    dst = tl.load(dst_offsets + i)
    written = tl.zeros([], dtype=tl.int64)
    for h in range(H):  # K page-heads, then V: page order
        written = _encode_page_head(
            heap_i16, heap_u8, src + h * RAW_PAGE_HEAD_BYTES, dst, written, meta_u8, i * 2 * H + h,
            KR, KC, NB, META_BYTES,
        )  # fmt: skip
    for h in range(H):
        written = _encode_page_head(
            heap_i16, heap_u8, src + (H + h) * RAW_PAGE_HEAD_BYTES, dst, written, meta_u8, i * 2 * H + H + h,
            VR, VC, NB, META_BYTES,
        )  # fmt: skip
    tl.store(sizes_out + i, written.to(tl.int32))


# ---- decode -------------------------------------------------------------------------------------------


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
def _decode_page_heads(
    heap_w, page, row0, meta_u8, meta_i32, out_w,
    D: tl.constexpr, R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, META_BYTES: tl.constexpr,
    G: tl.constexpr, USE_PRMT: tl.constexpr, STREAM: tl.constexpr,
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
    STREAM: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    ph0 = tl.program_id(1) * G  # G divides H: a program's page-heads are all K or all V
    row0 = i * 2 * H + ph0
    page = tl.load(offsets + i)
    # A constexpr test first: with one geometry for K and V, only one copy of the restore is compiled.
    if KR == VR:  # noqa: SIM114
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, KR, KC, NB, META_BYTES, G, USE_PRMT, STREAM
        )
    elif ph0 < H:
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, KR, KC, NB, META_BYTES, G, USE_PRMT, STREAM
        )
    else:
        _decode_page_heads(
            heap_w, page, row0, meta_u8, meta_i32, out_w, D, VR, VC, NB, META_BYTES, G, USE_PRMT, STREAM
        )


# ---- store tokens -------------------------------------------------------------------------------------


@triton.jit
def _store_head(heap_i16, src_row, dst_page_head, t, D: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    c = tl.arange(0, D)
    pos = ((t // R) * (D // C) + c // C) * 512 + (t % R) * C + c % C
    tl.store(heap_i16 + dst_page_head + pos, tl.load(src_row + c))


@triton.jit
def _store_tokens_kernel(
    heap_i16, page_loc, slots, k_i16, v_i16, H,
    D: tl.constexpr, KR: tl.constexpr, KC: tl.constexpr, VR: tl.constexpr, VC: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    ph = tl.program_id(1)
    slot = tl.load(slots + n)
    t = slot % _TOKENS
    page_head = tl.load(page_loc + slot // _TOKENS) // 2 + ph * (_TOKENS * D)
    if ph < H:
        _store_head(heap_i16, k_i16 + (n * H + ph) * D, page_head, t, D, KR, KC)
    else:
        _store_head(heap_i16, v_i16 + (n * H + ph - H) * D, page_head, t, D, VR, VC)


# ---- wrappers -----------------------------------------------------------------------------------------


def _check_heap(heap: torch.Tensor) -> None:
    if heap.dtype != torch.uint8 or heap.dim() != 1 or heap.numel() % 4 != 0:
        raise ValueError(
            f"heap must be a 1-D uint8 tensor of a multiple of 4 bytes, got {heap.dtype} {list(heap.shape)}"
        )
    if heap.device.type != "cuda" and not _INTERPRET:
        raise RuntimeError(
            "the Triton codec needs a CUDA device; on the CPU set TRITON_INTERPRET=1 before importing "
            "zipkv.kernels.codec, or use zipkv.kernels.reference"
        )


def _check(
    name: str, x: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    if x.dtype != dtype or tuple(x.shape) != shape or x.device != device or not x.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dtype} tensor of shape {list(shape)} on {device}, "
            f"got {x.dtype} {list(x.shape)} on {x.device}"
        )


def _geometry_args(fmt: PageFormat) -> dict[str, int]:
    return {"KR": fmt.k_geometry.tokens, "KC": fmt.k_geometry.channels,
            "VR": fmt.v_geometry.tokens, "VC": fmt.v_geometry.channels}  # fmt: skip


def encode_pages(
    heap: torch.Tensor,
    src_offsets: torch.Tensor,
    dst_offsets: torch.Tensor,
    meta_out: torch.Tensor,
    sizes_out: torch.Tensor,
    fmt: PageFormat,
    num_warps: int = 4,
) -> None:
    """Compress n full raw pages at byte ``src_offsets`` (int64 [n]) into ``dst_offsets`` (int64 [n]).

    Writes each page's metadata into ``meta_out`` (uint8 [n, 2H, meta_bytes]) and its stored size in bytes
    (blocks only, metadata excluded) into ``sizes_out`` (int32 [n]). One launch, no host sync. Offsets must
    be multiples of 256; each destination needs room for ``fmt.raw_page_bytes`` and must not overlap any
    source page.
    """
    _check_heap(heap)
    n = src_offsets.numel()
    dev = heap.device
    _check("src_offsets", src_offsets, torch.int64, (n,), dev)
    _check("dst_offsets", dst_offsets, torch.int64, (n,), dev)
    _check("meta_out", meta_out, torch.uint8, (n, fmt.page_heads_per_page, fmt.meta_bytes), dev)
    _check("sizes_out", sizes_out, torch.int32, (n,), dev)
    if n == 0:
        return
    _encode_pages_kernel[(n,)](
        heap.view(torch.int16), heap, src_offsets, dst_offsets, meta_out, sizes_out,
        fmt.num_kv_heads, fmt.raw_page_head_bytes, NB=fmt.blocks_per_page_head, META_BYTES=fmt.meta_bytes,
        num_warps=num_warps, **_geometry_args(fmt),
    )  # fmt: skip


def decode_pages(
    heap: torch.Tensor,
    offsets: torch.Tensor,
    meta: torch.Tensor,
    out: torch.Tensor,
    fmt: PageFormat,
    num_warps: int = 4,
    use_prmt: bool | None = None,
    page_heads_per_program: int = 1,
    stream_stores: bool = False,
) -> None:
    """Restore n pages (raw or compressed) at byte ``offsets`` (int64 [n]) with metadata ``meta``
    (uint8 [n, 2H, meta_bytes]) into ``out`` (bf16 [n, 2, H, 16, D]). One launch, no host sync.

    Offsets must be multiples of 256 (the kernel reads whole 16-byte vectors). ``use_prmt`` picks the PTX
    byte interleave (GPU only); by default it is on when compiled and off under the interpreter."""
    _check_heap(heap)
    n = offsets.numel()
    dev = heap.device
    h, d = fmt.num_kv_heads, fmt.head_dim
    _check("offsets", offsets, torch.int64, (n,), dev)
    _check("meta", meta, torch.uint8, (n, 2 * h, fmt.meta_bytes), dev)
    _check("out", out, torch.bfloat16, (n, 2, h, PAGE_TOKENS, d), dev)
    if n == 0:
        return
    if use_prmt is None:
        use_prmt = not _INTERPRET
    g = page_heads_per_program
    if g < 1 or h % g != 0 or g & (g - 1):
        raise ValueError(f"page_heads_per_program must be a power of two dividing num_kv_heads {h}, got {g}")
    _decode_pages_kernel[(n, 2 * h // g)](
        heap.view(torch.int32), offsets, meta, meta.view(torch.int32), out.view(torch.int32), h, D=d,
        NB=fmt.blocks_per_page_head, META_BYTES=fmt.meta_bytes, G=g, USE_PRMT=use_prmt, STREAM=stream_stores,
        num_warps=num_warps, **_geometry_args(fmt),
    )  # fmt: skip


def store_tokens(
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Write tokens ``k``, ``v`` (bf16 [n, H, D]) into their raw pages; ``slot = page_id * 16 + offset``."""
    _check_heap(heap)
    n = slots.numel()
    dev = heap.device
    h, d = fmt.num_kv_heads, fmt.head_dim
    _check("slots", slots, torch.int64, (n,), dev)
    _check("k", k, torch.bfloat16, (n, h, d), dev)
    _check("v", v, torch.bfloat16, (n, h, d), dev)
    if page_loc_layer.dtype != torch.int64 or page_loc_layer.device != dev:
        raise ValueError(
            f"page_loc_layer must be int64 on {dev}, got {page_loc_layer.dtype} on {page_loc_layer.device}"
        )
    if n == 0:
        return
    _store_tokens_kernel[(n, 2 * h)](
        heap.view(torch.int16), page_loc_layer, slots, k.view(torch.int16), v.view(torch.int16), h, D=d,
        num_warps=1, **_geometry_args(fmt),
    )  # fmt: skip
